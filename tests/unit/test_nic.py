"""NIC congestion: counter sequences with resets, wraps and saturation; planted episodes and flaps."""

import numpy as np
import pytest

from vigil.detectors.base import DetectorError
from vigil.detectors.nic import NicCongestion, counter_delta


@pytest.mark.parametrize(
    "old,new,bits,sat,expect",
    [
        (100, 150, 64, False, (50, "ok")),
        (2**32 - 10, 5, 32, False, (15, "wrap")),
        (2**64 - 1, 4, 64, False, (5, "wrap")),
        (2**32 - 100, 50, 64, False, (150, "wrap")),  # 32-bit hardware counter behind a 64-bit file
        (123_456, 789, 64, False, (789, "reset")),
        (2**31, 10, 32, False, (10, "reset")),  # not near the top: a reset, not a wrap
        (250, 255, 8, True, (5, "saturated")),
        (255, 255, 8, True, (0, "saturated")),
        (200, 3, 8, True, (3, "reset")),  # saturating counters never wrap
    ],
)
def test_counter_delta(old, new, bits, sat, expect):
    assert counter_delta(old, new, bits, saturating=sat) == expect


def _feed(det, rates, port="mlx5_0/1", start=None, dt=10.0, t0=0.0, seed=0):
    """Cumulative counters from per-interval rates (dict name -> array of rates)."""
    rng = np.random.default_rng(seed)
    c = dict(start or {k: 0 for k in rates})
    n = len(next(iter(rates.values())))
    det.update(dict(c), t=t0, port=port)
    for i in range(n):
        for k, r in rates.items():
            c[k] = c[k] + int(rng.poisson(r[i] * dt))
        det.update(dict(c), t=t0 + dt * (i + 1), port=port)
    return c


def test_planted_congestion_episode_onset_and_end():
    n = 80
    cnp = np.full(n, 300.0)
    cnp[50:60] = 6000.0  # congestion in intervals 50..59 -> readings at t = 510..600
    det = NicCongestion(node="n1")
    _feed(det, {"np_cnp_sent": cnp[:52], "rp_cnp_handled": np.full(52, 200.0)})
    assert det.finding is None  # two excess intervals: not yet
    det2 = NicCongestion(node="n1")
    _feed(det2, {"np_cnp_sent": cnp[:56], "rp_cnp_handled": np.full(56, 200.0)})
    f = det2.finding
    assert f is not None and f.kind == "congestion" and f.severity == 3
    assert f.onset == 500.0  # start of interval 50
    assert f.detected_at == 530.0  # third excess reading
    assert f.evidence["signals"] == ["np_cnp_sent"] and f.evidence["ratio"]["np_cnp_sent"] > 10
    det3 = NicCongestion()
    _feed(det3, {"np_cnp_sent": cnp, "rp_cnp_handled": np.full(n, 200.0)})
    assert det3.finding is None  # ended after three normal intervals


def test_reset_and_wrap_do_not_look_like_congestion():
    det = NicCongestion()
    rng = np.random.default_rng(1)
    c = {"np_cnp_sent": 2**32 - 40_000, "rp_cnp_handled": 10**12, "np_ecn_marked_roce_packets": 5_000}
    t = 0.0
    for i in range(60):
        det.update(dict(c), t=t, port="p")
        t += 10.0
        c["np_cnp_sent"] = (c["np_cnp_sent"] + int(rng.poisson(3000))) % 2**32  # 32-bit wrap at ~i=13
        c["rp_cnp_handled"] += int(rng.poisson(2000))
        c["np_ecn_marked_roce_packets"] += int(rng.poisson(3500))
        if i == 30:  # driver reload
            c = {k: int(rng.poisson(3000)) for k in c}
        assert det.finding is None, i
    an = det.counter_anomalies("p")
    assert an["wrap"] == 1 and an["reset"] == 3
    assert abs(det.rates("p")["np_cnp_sent"] - 300.0) < 100


def test_link_flap_sev3_then_escalates_to_sev2_then_clears():
    det = NicCongestion(flap_hold=300.0, flap_window=600.0, flap_escalate=3)
    c = {"link_downed": 0, "link_error_recovery": 0, "np_cnp_sent": 0}
    t = 0.0
    det.update(dict(c), t=t, port="ib0")
    flaps_at = {5, 12, 20}
    sev = {}
    for i in range(1, 40):
        t = 10.0 * i
        if i in flaps_at:
            c["link_downed"] += 1
            c["link_error_recovery"] += 2
        det.update(dict(c), t=t, port="ib0")
        f = det.finding
        sev[i] = None if f is None else (f.kind, f.severity)
    assert sev[4] is None
    assert sev[5] == ("link_flap", 3)
    assert sev[12] == ("link_flap", 3)
    assert sev[20] == ("link_flap", 2)
    f = det.finding
    assert f.onset == 50.0 and f.evidence["counters"] == {"link_downed": 3, "link_error_recovery": 6}
    det.tick(200.0 + 301.0)
    assert det.finding is None


def test_saturated_ib_counter_is_not_an_error_burst():
    det = NicCongestion()
    det.update({"symbol_error": 65530}, t=0.0, port="ib0")
    det.update({"symbol_error": 65535}, t=10.0, port="ib0")
    det.update({"symbol_error": 65535}, t=20.0, port="ib0")
    assert det.counter_anomalies("ib0")["saturated"] == ["symbol_error"]
    assert det.finding is None


def test_transport_errors():
    det = NicCongestion(error_rate=1.0)
    det.update({"local_ack_timeout_err": 0, "packet_seq_err": 0}, t=0.0, port="p")
    det.update({"local_ack_timeout_err": 50, "packet_seq_err": 20}, t=10.0, port="p")
    f = det.finding
    assert f.kind == "transport_errors" and f.onset == 0.0 and f.evidence["error_rates"]["local_ack_timeout_err"] == 5.0
    det.update({"local_ack_timeout_err": 50, "packet_seq_err": 20}, t=20.0, port="p")
    assert det.finding is None


def test_ports_are_independent_and_duplicates_ignored():
    det = NicCongestion()
    det.update({"link_downed": 0}, t=0.0, port="a")
    det.update({"link_downed": 5}, t=0.0, port="b")
    det.update({"link_downed": 5}, t=10.0, port="b")
    det.update({"link_downed": 0}, t=10.0, port="a")
    det.update({"link_downed": 0}, t=10.0, port="a")  # duplicate delivery
    assert det.finding is None
    with pytest.raises(DetectorError):
        det.update({"link_downed": 0}, t=5.0, port="a")


@pytest.mark.parametrize("kw", [{"warmup": 0}, {"z": -1}, {"min_rate": 0}, {"widths": {"x": 65}}, {"warmup": 200, "baseline_window": 100}])
def test_bad_params(kw):
    with pytest.raises(DetectorError):
        NicCongestion(**kw)


def test_bad_counters():
    det = NicCongestion()
    with pytest.raises(DetectorError):
        det.update({"np_cnp_sent": -1}, t=0.0)
    with pytest.raises(DetectorError):
        det.update([1, 2], t=0.0)


def test_baseline_statistics_match_numpy_as_the_window_slides():
    """The kept-sorted window and the MAD's binary search give numpy's median and MAD, to the bit, through
    evictions, ties and even and odd lengths (refresh=1: recomputed after every value)."""
    from vigil.detectors.nic import _Baseline

    rng = np.random.default_rng(7)
    for window in (1, 2, 5, 16, 120):
        b = _Baseline(window, refresh=1)
        for i in range(400):
            kind = i % 3
            value = float(rng.integers(0, 4)) if kind == 0 else float(rng.exponential(1e3)) if kind == 1 else 0.0
            b.add(value)
            arr = np.array(b.values)
            med = float(np.median(arr))
            assert b.stats() == (med, float(np.median(np.abs(arr - med))))
            assert b.ordered == sorted(b.values)
