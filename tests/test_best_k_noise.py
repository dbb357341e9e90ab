"""A best K that rests on costs whose measured spread overlaps another K's is within noise:
the smallest of the Ks the timing cannot tell apart is recommended and the others named
as equivalent (SP312, "K = 1–2 equivalent"); costs given by flag (no spread) are exact and
never rival."""

from __future__ import annotations

import math

from specprobe.estimates.estimate import KRow, best_k, equivalent_range
from specprobe.probe.assemble import best_k_rivals


def _row(k: int, speedup: float, low: float, high: float) -> KRow:
    return KRow(k=k, tau_tokens=1.5, accept_rate=0.3, iid_tau_tokens=1.5, speedup=speedup, speedup_low=low, speedup_high=high)


def test_overlapping_speedup_ranges_are_rivals_nearest_first() -> None:
    rows = [_row(1, 0.83, 0.78, 0.90), _row(2, 0.80, 0.70, 0.85), _row(3, 0.60, 0.55, 0.66), _row(4, 0.79, 0.76, 0.80)]
    assert [r.k for r in best_k_rivals(rows)] == [2, 4]  # K = 3's best case (0.66) stays under K = 1's worst (0.78)


def test_ranges_apart_and_given_costs_have_no_rival() -> None:
    apart = [_row(1, 0.83, 0.80, 0.86), _row(2, 0.70, 0.66, 0.74)]
    assert best_k_rivals(apart) == []
    given = [_row(1, 0.83, 0.83, 0.83), _row(2, 0.83, 0.83, 0.83)]  # --cost-ratio/--verify-factor: no spread
    assert best_k_rivals(given) == []
    assert best_k_rivals([_row(1, math.nan, math.nan, math.nan)]) == []


def test_the_smallest_k_within_noise_is_recommended() -> None:
    # K = 2 is fastest by its median, but K = 1's range reaches its low end: K = 1 recommended
    rows = [_row(1, 0.80, 0.70, 0.85), _row(2, 0.83, 0.78, 0.90), _row(3, 0.60, 0.55, 0.66)]
    assert best_k(rows).k == 1 and equivalent_range(rows) == [1, 2]
    assert [r.k for r in best_k_rivals(rows)] == [2]
    # apart: the fastest, as before
    apart = [_row(1, 0.70, 0.66, 0.74), _row(2, 0.83, 0.80, 0.86)]
    assert best_k(apart).k == 2 and equivalent_range(apart) == []
    # given costs (no spread): exactly the old choice, the fastest K, the smaller on a tie
    given = [_row(1, 0.80, 0.80, 0.80), _row(2, 0.83, 0.83, 0.83), _row(3, 0.83, 0.83, 0.83)]
    assert best_k(given).k == 2 and equivalent_range(given) == []


def test_equivalent_words() -> None:
    from specprobe.result.run import equivalent_words

    assert equivalent_words([1, 2]) == "K = 1–2 equivalent"
    assert equivalent_words([1, 2, 4]) == "K = 1, 2, 4 equivalent"
    assert equivalent_words([3]) is None and equivalent_words([]) is None


def test_a_diagnose_with_timed_costs_names_its_rival(real_results) -> None:
    """The tiny pair's real run: whatever the timing gave, the metric and the finding agree
    with the K table's own ranges."""
    r = real_results.skip
    rows = [KRow(**{k: getattr(row, k) for k in ("k", "tau_tokens", "accept_rate", "iid_tau_tokens", "speedup", "speedup_low", "speedup_high")}) for row in r.k_table]
    rows = [KRow(**{**row.__dict__, **{f: (math.nan if getattr(row, f) is None else getattr(row, f)) for f in ("speedup", "speedup_low", "speedup_high")}}) for row in rows]
    rivals = best_k_rivals(rows)
    assert r.metrics["best_k_rivals"] == len(rivals)
    assert ("SP312" in {f.rule_id for f in r.findings}) == bool(rivals)
    assert r.best_k == best_k(rows).k
    assert r.best_k_equivalent == equivalent_range(rows)
