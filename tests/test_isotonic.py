"""The isotonic fit the measured verify factors go through: closed forms of
pool-adjacent-violators, and the cost tables pricing the fitted v_K (raw kept beside)."""

from __future__ import annotations

import math

import pytest

from specprobe.estimates.costs import cost_tables
from specprobe.estimates.isotonic import non_decreasing, non_decreasing_repeats


def test_pava_closed_forms() -> None:
    assert non_decreasing([]) == []
    assert non_decreasing([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]  # already monotone: unchanged
    assert non_decreasing([3.0, 1.0]) == [2.0, 2.0]  # one violation: the pair's mean
    assert non_decreasing([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert non_decreasing([4.0, 3.0, 2.0, 1.0]) == [2.5] * 4  # decreasing: all pooled
    assert non_decreasing([1.0, 5.0, 1.0, 1.0]) == [1.0, 7 / 3, 7 / 3, 7 / 3]  # the pool grows backwards
    # weighted: the pool is the weighted mean (weight 3 on 3.0, 1 on 1.0 -> 2.5)
    assert non_decreasing([3.0, 1.0], [3.0, 1.0]) == [2.5, 2.5]
    # NaN stays in place and is skipped
    out = non_decreasing([2.0, math.nan, 1.0])
    assert out[0] == out[2] == 1.5 and math.isnan(out[1])
    with pytest.raises(ValueError):
        non_decreasing([1.0], [1.0, 2.0])


def test_fitted_repeats_are_monotone_and_keep_their_shape() -> None:
    rows = [[1.2, 1.1, 1.3], [1.0, 1.2, 1.1], [1.4, 1.5]]
    out = non_decreasing_repeats(rows)
    assert [len(r) for r in out] == [3, 3, 2]
    assert out[0][0] == out[1][0] == pytest.approx(1.1) and out[2][0] == 1.4  # repeat 0: 1.2 > 1.0 pooled
    assert out[0][2] == out[1][2] == pytest.approx(1.2)  # repeat 2 (K = 3 untimed there): 1.3 > 1.1 pooled
    for i in range(2):
        assert out[0][i] <= out[1][i] <= out[2][i]


def test_cost_tables_price_the_fitted_verify_factors_and_keep_the_raw() -> None:
    """v_2 timed below v_1 (noise): priced as the pool, never below v_1; the raw medians
    stay recorded. A given --verify-factor is used as given."""
    raw = {"batches": [{"batch_size": 1, "draft_ratios": [0.1, 0.1, 0.1], "verify_ratios": [[1.10, 1.12, 1.08], [1.02, 1.04, 1.00], [1.3, 1.3, 1.3]]}]}
    (t,) = cost_tables(raw, 3, None, None)
    v = [rc.verify_factor for rc in t.rounds]
    assert v[0] == pytest.approx(1.06) and v[1] == pytest.approx(1.06) and v[2] == pytest.approx(1.3)
    assert t.verify_raw == pytest.approx([1.10, 1.02, 1.3])
    assert [rc.cost for rc in t.rounds] == pytest.approx([0.1 + 1.06, 0.2 + 1.06, 0.3 + 1.3])
    (g,) = cost_tables(raw, 3, None, 1.05)
    assert [rc.verify_factor for rc in g.rounds] == [1.05] * 3 and g.verify_raw == [None] * 3
