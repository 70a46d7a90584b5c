"""The GPU detector's one-sort peer medians equal the median of the others, computed plainly."""

from hypothesis import given, strategies as st

from vigil.detectors.gpu import _median, _peer_medians


@given(st.lists(st.sampled_from([1005.0, 1410.0, 1980.0, 60.5, 61.0, 83.0, 0.0]), min_size=2, max_size=9))
def test_peer_medians_equal_the_median_of_the_others(values):
    named = {f"g{i}": v for i, v in enumerate(values)}
    expected = {k: _median([v for j, v in named.items() if j != k]) for k in named}
    assert _peer_medians(named) == expected
