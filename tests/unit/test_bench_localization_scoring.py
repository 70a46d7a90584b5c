"""The localizer benchmark's scoring (``vigil.bench.localization.score_localizer``) on scripted answers.

The generator and every localizer the benchmark calls are replaced by fakes
with known answers, so what is tested is the counting: a perfect localizer,
one that never names a culprit, one that always names the same one, and an
online localizer whose verdict arrives k iterations late.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vigil.bench import localization

# Four cases, cycled: (culprit class, location)
TRUTHS = [("worker", 3), ("stage", 1), ("link", ("dp", 0)), ("none", None)]


@pytest.fixture
def scripted(monkeypatch):
    """Patch the generator to cycle TRUTHS; return a setter for the localizers' answers."""
    state = {"k": 0}

    def make_case(rng, n_iters=8, **_):
        truth = TRUTHS[state["k"] % len(TRUTHS)]
        state["k"] += 1
        its = [[{"truth": truth}] for _ in range(n_iters)]
        return its, {"culprit": truth[0], "location": truth[1], "bubbles": False}

    monkeypatch.setattr(localization, "make_localization_case", make_case)

    def answer_with(window, online_delay=0, single=None, falcon=None):
        """``window(truth) -> (culprit, location)`` for the windowed localizer; the others follow unless given."""
        def verdict(fn, truth):
            culprit, location = fn(truth)
            return SimpleNamespace(culprit=culprit, location=location)

        monkeypatch.setattr(localization, "localize_window", lambda its: verdict(window, its[-1][0]["truth"]))
        monkeypatch.setattr(localization, "localize", lambda it: verdict(single or window, it[0]["truth"]))
        monkeypatch.setattr(localization, "_median_records", lambda its: its[-1])
        monkeypatch.setattr(localization, "replay_through_hooks", lambda its, marked=True: its)  # the records as given
        monkeypatch.setattr(localization, "falcon_localize", lambda it: verdict(falcon or window, it[0]["truth"]))

        class Online:
            def __init__(self):
                self.seen = 0
                self.localization = None

            def update(self, recs, t):
                self.seen += 1
                if self.seen > online_delay:
                    self.localization = verdict(window, recs[0]["truth"])

        monkeypatch.setattr(localization, "StragglerLocalizer", Online)

    return answer_with


def test_perfect_localizer(scripted):
    scripted(lambda truth: truth)
    r = localization.score_localizer(seed=0, n_cases=8, n_iters=4)
    assert r["accuracy"] == r["accuracy_online"] == r["accuracy_single_iteration"] == r["falcon_accuracy"] == 1.0
    assert r["by_class"] == {"link": 1.0, "none": 1.0, "stage": 1.0, "worker": 1.0}
    direct = r["sections"]["all_ranks"]["direct"]
    assert {c: v["n"] for c, v in direct["by_class"].items()} == {"link": 2, "none": 2, "stage": 2, "worker": 2}


def test_never_naming_a_culprit_scores_the_share_of_healthy_cases(scripted):
    scripted(lambda truth: ("none", None))
    r = localization.score_localizer(seed=0, n_cases=8, n_iters=4)
    assert r["accuracy"] == 0.25  # 2 of 8 cases have no culprit
    assert r["by_class"]["none"] == 1.0 and r["by_class"]["worker"] == 0.0


def test_right_class_wrong_location_is_wrong(scripted):
    scripted(lambda truth: (truth[0], "elsewhere") if truth[0] != "none" else truth)
    r = localization.score_localizer(seed=0, n_cases=8, n_iters=4)
    assert r["accuracy"] == 0.25
    assert r["sections"]["all_ranks"]["direct"]["confusion"]["worker"] == {"worker@wrong_location": 2}


@pytest.mark.parametrize("delay,expected", [(0, 1.0), (3, 1.0), (4, 0.0)])
def test_online_verdict_late_by_k(scripted, delay, expected):
    # the online localizer is read after the last of 4 iterations: a verdict 4 late never comes
    scripted(lambda truth: truth, online_delay=delay)
    r = localization.score_localizer(seed=0, n_cases=8, n_iters=4)
    assert r["accuracy_online"] == expected
    assert r["accuracy"] == 1.0
