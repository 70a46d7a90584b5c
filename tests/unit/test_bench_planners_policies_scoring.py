"""The scoring code of the planners and policies benchmarks, on hand-made cases whose answers are known.

Planners: which baseline is the best and by how much ours beats it
(:func:`vigil.bench.planners.quality_row`, :func:`~vigil.bench.planners.quality_summary`).
Policies: whether a target is met, and whether its bound could reach it on
this seed or any seed of the sweep (:func:`vigil.bench.policies.targets`,
``held_against``, ``sweep_range``).
"""

from __future__ import annotations

from typing import Any

import pytest

from vigil.actuators.planners import place_best_fit, place_job, place_packing, place_random_fit
from vigil.actuators.planners.placement import Placement
from vigil.bench.planners import quality_row, quality_summary
from vigil.bench.policies import held_against, sweep_range, targets


def placed(dp_spread: int, pp_splits: int, method: str = "hand", optimal: bool | None = None) -> Placement:
    """A placement with the given spread and splits (objective with alpha = beta = 1); the layout is not read."""
    return Placement(dp=2, pp=2, rank_nodes=(), rank_minipods=(), pp_group_minipods=(), dp_spread=dp_spread,
                     dp_spread_total=dp_spread, pp_splits=pp_splits, objective=float(dp_spread + pp_splits),
                     optimal=optimal, method=method)


# -- planners: the placement quality comparison ---------------------------------------------------------


def test_the_best_baseline_is_the_lowest_objective_and_the_ratio_is_its_over_ours():
    row = quality_row(7, 40, placed(1, 0, optimal=True),
                      {"best_fit": placed(2, 1), "random_fit": placed(3, 2), "packing": placed(2, 0)})
    assert row["best_baseline"] == "packing"
    assert row["ratio"] == 2.0 and row["dp_spread_ratio"] == 2.0
    assert (row["seed"], row["free_nodes"]) == (7, 40)
    assert row["ours"] == {"dp_spread": 1, "pp_splits": 0, "objective": 1.0, "optimal": True}
    assert row["random_fit"] == {"dp_spread": 3, "pp_splits": 2, "objective": 5.0}


def test_a_tie_between_baselines_goes_to_the_first_named():
    row = quality_row(0, 8, placed(1, 0), {"best_fit": placed(2, 0), "random_fit": placed(3, 0),
                                           "packing": placed(1, 1)})
    assert row["best_baseline"] == "best_fit" and row["ratio"] == 2.0
    assert row["dp_spread_ratio"] == 2.0  # the tie-break decides which spread is compared


def test_ours_worse_than_a_baseline_shows_as_a_ratio_below_one():
    row = quality_row(0, 8, placed(2, 1), {"best_fit": placed(1, 0), "random_fit": placed(4, 0), "packing": placed(2, 2)})
    assert row["best_baseline"] == "best_fit"
    assert row["ratio"] == pytest.approx(1 / 3) and row["dp_spread_ratio"] == 0.5


def test_ours_at_zero_gives_no_ratio_rather_than_a_division_by_zero():
    row = quality_row(0, 8, placed(0, 0), {"best_fit": placed(1, 0)})
    assert row["ratio"] is None and row["dp_spread_ratio"] is None


def test_summary_medians_leave_out_missing_ratios():
    rows = [quality_row(0, 8, placed(1, 0), {"a": placed(2, 0)}),             # ratio 2, spread ratio 2
            quality_row(1, 8, placed(1, 1), {"a": placed(1, 1)}),             # 1, 1
            quality_row(2, 8, placed(0, 0), {"a": placed(1, 0)}),             # None, None
            quality_row(3, 8, placed(2, 2), {"a": placed(1, 1)})]             # 0.5, 0.5
    s = quality_summary(rows)
    assert (s["ratio_median"], s["ratio_min"], s["ratio_max"]) == (1.0, 0.5, 2.0)
    assert s["dp_spread_ratio_median"] == 1.0
    assert s["pp_splits_median"] == {"ours": 0.5, "best_baseline": 0.5}  # ours 0,1,0,2; baseline 0,1,0,1
    assert s["per_seed"] == rows


def test_summary_of_clusters_without_any_ratio_is_none():
    s = quality_summary([quality_row(0, 8, placed(0, 0), {"a": placed(1, 0)})])
    assert s["ratio_median"] is None and s["ratio_min"] is None and s["dp_spread_ratio_median"] is None


def test_a_cluster_of_one_minipod_leaves_every_method_at_the_same_objective():
    """All free nodes in one minipod: every placement spans one minipod and splits no pipeline."""
    pods = [[0, 1, 2, 3, 4, 5]]
    base = {"best_fit": place_best_fit(pods, 3, 2), "random_fit": place_random_fit(pods, 3, 2, seed=1),
            "packing": place_packing(pods, 3, 2)}
    row = quality_row(1, 6, place_job(pods, 3, 2), base)
    assert row["ours"] == {"dp_spread": 1, "pp_splits": 0, "objective": 1.0, "optimal": True}
    assert all(row[k]["objective"] == 1.0 for k in base)
    assert row["best_baseline"] == "best_fit" and row["ratio"] == 1.0 and row["dp_spread_ratio"] == 1.0


# -- policies: targets and the bounds they are held against ---------------------------------------------


def a_result(trace: str = "trace-a", gpus: int = 128, ratio: float | None = 1.25, ettr: float = 0.98,
             oracle: float | None = 1.3, mitigated: float | None = 61.0, clairvoyant: float | None = 70.0,
             sweep: dict[str, Any] | None = None, scale: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parts of a policies result that the targets read."""
    detail: dict[str, Any] = {"oracle_ratio_vs_restart_only": oracle,
                              "failslow_clairvoyant": {"failslow_mitigated_pct": clairvoyant}}
    if sweep is not None:
        detail["seed_sweep"] = sweep
    if scale is not None:
        detail["scale_run"] = scale
    return {"trace": trace, "gpus": gpus, "failslow_mitigated_pct": mitigated, "detail": detail,
            "policies": {"vigil": {"waf_ratio_vs_restart_only": ratio, "ettr_mean": ettr}}}


def a_sweep(oracle: tuple[float, float] | None, clairvoyant: tuple[float, float] | None = None) -> dict[str, Any]:
    return {"oracle_ratio_range": list(oracle) if oracle else None,
            "failslow_clairvoyant_pct_range": list(clairvoyant) if clairvoyant else None}


def test_a_met_target_under_a_bound_that_reaches_it():
    t = targets(a_result())
    assert set(t) == {"waf_ratio_trace-a", "vigil_ettr_trace-a", "failslow_mitigated_pct"}
    w = t["waf_ratio_trace-a"]
    assert (w["target"], w["measured"], w["met"]) == (1.2, 1.25, True)
    assert (w["bound"], w["bound_max_over_seeds"], w["bound_reaches_target"]) == (1.3, None, True)
    assert t["vigil_ettr_trace-a"] == {"target": 0.97, "measured": 0.98, "met": True}


def test_a_bound_below_the_target_on_this_seed_but_above_it_on_another():
    w = targets(a_result(ratio=1.1, oracle=1.15, sweep=a_sweep((1.05, 1.25))))["waf_ratio_trace-a"]
    assert w["met"] is False
    assert (w["bound"], w["bound_max_over_seeds"], w["bound_reaches_target"]) == (1.15, 1.25, True)


def test_a_bound_below_the_target_on_every_seed():
    w = targets(a_result(ratio=1.1, oracle=1.15, sweep=a_sweep((1.05, 1.18))))["waf_ratio_trace-a"]
    assert w["met"] is False and w["bound_reaches_target"] is False


def test_a_bound_exactly_at_the_target_reaches_it_and_a_measure_exactly_at_it_meets_it():
    w = targets(a_result(ratio=1.2, oracle=1.2))["waf_ratio_trace-a"]
    assert w["met"] is True and w["bound_reaches_target"] is True


def test_no_bound_known_is_neither_reached_nor_missed():
    w = targets(a_result(oracle=None, sweep=a_sweep(None)))["waf_ratio_trace-a"]
    assert w["bound"] is None and w["bound_max_over_seeds"] is None and w["bound_reaches_target"] is None
    only_sweep = targets(a_result(oracle=None, sweep=a_sweep((1.0, 1.21))))["waf_ratio_trace-a"]
    assert only_sweep["bound_reaches_target"] is True


def test_a_missing_measure_does_not_meet_its_target():
    t = targets(a_result(ratio=None, mitigated=None))
    assert t["waf_ratio_trace-a"]["met"] is False and t["failslow_mitigated_pct"]["met"] is False


def test_the_failslow_target_is_held_against_a_reference_without_a_verdict():
    f = targets(a_result(mitigated=60.1, clairvoyant=55.0, sweep=a_sweep((1.0, 1.3), (50.0, 72.5))))[
        "failslow_mitigated_pct"]
    assert (f["target"], f["measured"], f["met"]) == (60.1, 60.1, True)
    assert (f["reference"], f["reference_max_over_seeds"]) == (55.0, 72.5)
    assert "bound" not in f and "bound_reaches_target" not in f
    assert targets(a_result(mitigated=60.0))["failslow_mitigated_pct"]["met"] is False


def test_case5_targets_apply_on_128_gpus_only_and_ettr_on_trace_a_only():
    assert set(targets(a_result(gpus=256))) == {"failslow_mitigated_pct"}
    b = targets(a_result(trace="trace-b", ratio=1.5, oracle=1.6))
    assert set(b) == {"waf_ratio_trace-b", "failslow_mitigated_pct"}
    assert b["waf_ratio_trace-b"]["target"] == 1.9 and b["waf_ratio_trace-b"]["met"] is False
    assert b["waf_ratio_trace-b"]["bound_reaches_target"] is False
    assert targets(a_result(ettr=0.969))["vigil_ettr_trace-a"]["met"] is False


def test_scale_targets_when_the_scale_run_was_made():
    def scale(mitigated: float | None, wall: float) -> dict[str, Any]:
        return {"policies": {"vigil": {"failslow_mitigated_pct": mitigated}}, "wall_s": {"vigil": wall},
                "cpu_s": {"vigil": wall - 1}, "wall_s_all_policies": wall + 10}

    t = targets(a_result(scale=scale(65.0, 599.9)))
    assert t["failslow_mitigated_pct_scale_run"] == {"target": 60.1, "measured": 65.0, "met": True}
    assert t["scale_wall_s"] == {"target": 600.0, "measured": 599.9, "met": True, "cpu_s": 598.9,
                                 "all_policies_s": 609.9}
    slow = targets(a_result(scale=scale(None, 600.0)))
    assert slow["failslow_mitigated_pct_scale_run"]["met"] is False  # no progress: not met
    assert slow["scale_wall_s"]["met"] is False  # "under 10 minutes": 600 s is not under


def test_sweep_range_leaves_out_seeds_without_a_value():
    rows = [{"x": 1.2}, {"x": None}, {"x": 0.9}, {"x": 1.0}]
    assert sweep_range(rows, "x") == [0.9, 1.2]
    assert sweep_range([{"x": None}], "x") is None
    assert sweep_range([], "x") is None


def test_held_against_reads_the_highest_seed_of_the_sweep():
    out = held_against(1.5, 1.1, "oracle_ratio", a_sweep((1.0, 1.6)))
    assert out["bound"] == 1.1 and out["bound_max_over_seeds"] == 1.6 and out["bound_reaches_target"] is True
    assert out["bound_is"].startswith("oracle")
    with pytest.raises(KeyError):
        held_against(1.5, 1.1, "no_such_yardstick", None)
