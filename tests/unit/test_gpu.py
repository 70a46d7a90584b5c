"""GPU degradation against planted throttling, slow clocks, hot GPUs, ECC and NVLink errors."""

import numpy as np
import pytest

from vigil.detectors.base import DetectorError
from vigil.detectors.gpu import DEFAULT_THROTTLE_MASK, GpuDegradation, decode_throttle_reasons


def healthy(rng, n=8, **over):
    s = {}
    for g in range(n):
        s[g] = {"sm_clock": float(1980 - abs(rng.normal(0, 10))), "temperature": float(63 + rng.normal(0, 2)),
                "utilization": 98.0, "power": 640.0, "throttle_reasons": 0x4, "ecc_sbe": 0, "ecc_dbe": 0, "nvlink_errors": 0}
    return s


def run(det, n_samples, mutate, seed=0):
    rng = np.random.default_rng(seed)
    state = {"sbe": 0, "dbe": 0, "nvl": 0}
    for i in range(n_samples):
        s = healthy(rng)
        mutate(i, s, state)
        det.update(s, t=10.0 * i)


def test_healthy_node_is_silent():
    det = GpuDegradation()
    run(det, 50, lambda i, s, st: None)
    assert det.findings == []


def test_thermal_throttle_and_hot_and_slow_gpu():
    det = GpuDegradation(min_samples=3)

    def m(i, s, st):
        if 10 <= i < 20:
            s[2].update(throttle_reasons=0x4 | 0x40, temperature=93.0, sm_clock=1300.0)

    run(det, 14, m)
    kinds = {(f.kind, f.evidence["gpu"], f.onset, f.detected_at) for f in det.findings}
    assert kinds == {("throttle", "2", 100.0, 120.0), ("temperature_outlier", "2", 100.0, 120.0), ("clock_below_peers", "2", 100.0, 120.0)}
    thr = [f for f in det.findings if f.kind == "throttle"][0]
    assert thr.evidence["reasons"] == ["hw_thermal_slowdown"]
    det2 = GpuDegradation(min_samples=3)
    run(det2, 26, m)  # recovered at 20, closed after 3 normal samples
    assert det2.findings == []


def test_sw_power_cap_alone_is_not_throttling():
    assert not (0x4 & DEFAULT_THROTTLE_MASK)
    assert decode_throttle_reasons(0x8 | 0x80) == ["hw_slowdown", "hw_power_brake_slowdown"]


def test_idle_gpu_low_clock_is_not_slow():
    det = GpuDegradation()

    def m(i, s, st):
        s[4].update(sm_clock=210.0, utilization=0.0, throttle_reasons=0x1)

    run(det, 10, m)
    assert det.findings == []


def test_temperature_outlier_needs_margin_over_peers():
    det = GpuDegradation(temp_margin=10.0)

    def m(i, s, st):
        s[1]["temperature"] = 70.0  # +7 deg C: warm, not an outlier

    run(det, 10, m)
    assert det.findings == []


def test_ecc_dbe_is_sev1_and_sbe_counts_with_reset():
    det = GpuDegradation(sbe_threshold=100, window=600.0, hold=300.0)

    def m(i, s, st):
        if i == 5:
            st["dbe"] = 1
        if i >= 8:
            st["sbe"] += 30
        if i == 12:
            st["sbe"] = 5  # driver reload reset the counter: +5
        s[6].update(ecc_dbe=st["dbe"], ecc_sbe=st["sbe"])

    run(det, 13, m)
    fs = det.findings
    assert fs[0].kind == "ecc_dbe" and fs[0].severity == 1 and fs[0].evidence["gpu"] == "6" and fs[0].onset == 50.0
    sbe = [f for f in fs if f.kind == "ecc_sbe"][0]
    # increases 30 at 80, 90, 100, 110 (=120 >= 100 at t=110), then +5 after the reset
    assert sbe.onset == 80.0 and sbe.detected_at == 110.0 and sbe.evidence["in_window"] == 125
    det.tick(50.0 + 301.0)
    assert all(f.kind != "ecc_dbe" for f in det.findings)


def test_nvlink_error_increments():
    det = GpuDegradation(nvlink_threshold=10)

    def m(i, s, st):
        if i >= 3:
            st["nvl"] += 4
        s[0].pop("nvlink_errors")
        s[0].update(nvlink_crc_errors=st["nvl"], nvlink_replay_errors=st["nvl"] // 2)

    run(det, 6, m)
    f = [f for f in det.findings if f.kind == "nvlink_errors"]
    assert len(f) == 1 and f[0].evidence["gpu"] == "0" and f[0].onset == 30.0 and f[0].detected_at == 40.0


def test_input_validation():
    det = GpuDegradation()
    with pytest.raises(DetectorError):
        det.update({0: {"sm_clock": float("nan")}}, t=0.0)
    with pytest.raises(DetectorError):
        det.update({0: {"ecc_dbe": -1}}, t=0.0)
    det.update({0: {"sm_clock": 1.0}}, t=5.0)
    with pytest.raises(DetectorError):
        det.update({0: {"sm_clock": 1.0}}, t=4.0)
    with pytest.raises(DetectorError):
        GpuDegradation(clock_rel=1.5)
    with pytest.raises(DetectorError):
        GpuDegradation(min_samples=0)
