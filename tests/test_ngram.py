"""The n-gram drafters (specprobe.drafters.ngram) on hand-made token sequences whose
proposals are known, spec parsing and bounds, and properties: every prompt-lookup
proposal continues an earlier occurrence of the context's suffix, and vLLM's rule
(longest n-gram, then earliest occurrence) is the one its prefix-function search finds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specprobe.core.errors import ConfigError
from specprobe.drafters.ngram import (
    CACHE,
    MAP_K,
    MOD,
    SIMPLE,
    NgramDrafter,
    is_ngram_spec,
    parse_spec,
    simple_draft,
    vllm_propose,
)


# ----------------------------------------------------------------------------- vLLM prompt lookup
def test_vllm_docstring_example() -> None:
    # [4,2,3] has no earlier match; [2,3] matches at 1 and three tokens follow it
    assert vllm_propose([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]


def test_vllm_no_match_and_too_short() -> None:
    assert vllm_propose([1, 2, 3, 4, 5], 1, 3, 4) == []
    assert vllm_propose([1, 2, 1], 3, 3, 4) == []  # context shorter than... no 3-gram repeats
    assert vllm_propose([7], 1, 1, 4) == []


def test_vllm_longest_beats_most_recent() -> None:
    # suffix [1,2,3] occurs at 0; the 1-gram [3] occurs later too, the longest wins
    assert vllm_propose([1, 2, 3, 4, 0, 3, 5, 0, 1, 2, 3], 1, 3, 2) == [4, 0]


def test_vllm_earliest_among_the_longest() -> None:
    # [2,3] occurs at 1 and at 5: vLLM takes the earliest
    assert vllm_propose([5, 2, 3, 7, 1, 2, 3, 8, 2, 3], 1, 3, 2) == [7, 1]


def test_vllm_min_n_is_a_minimum_hit_length() -> None:
    ctx = [9, 2, 3, 7, 1, 8, 3]
    assert vllm_propose(ctx, 1, 3, 2) == [7, 1]  # [3] matches
    assert vllm_propose(ctx, 2, 3, 2) == []  # no 2-gram repeats


def test_vllm_k_and_max_model_len() -> None:
    ctx = [1, 2, 3, 4, 5, 6, 1, 2]
    assert vllm_propose(ctx, 2, 2, 3) == [3, 4, 5]
    assert vllm_propose(ctx, 2, 2, 3, max_model_len=len(ctx) + 1) == [3]
    assert vllm_propose(ctx, 2, 2, 3, max_model_len=len(ctx)) == []


def _kmp_reference(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's search as it is written: the prefix function over the reversed context,
    capped at max_n, keeping the last position (in reversed order) of the longest."""
    total = len(tokens)
    if total < min_n or k <= 0:
        return []
    rev = tokens[::-1]
    lps = [0] * max_n
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start : start + min(k, total - start)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=60),
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(1, 6),
)
def test_vllm_proposal_continues_an_earlier_match(tokens: list[int], min_n: int, extra: int, k: int) -> None:
    max_n = min_n + extra
    out = vllm_propose(tokens, min_n, max_n, k)
    assert out == _kmp_reference(tokens, min_n, max_n, k)
    if not out:
        return
    t = len(tokens)
    # some n in [min_n, max_n]: the last n tokens occur earlier (ending before the last
    # token) and the proposal is what followed that occurrence
    hits = [
        (n, s)
        for n in range(min_n, max_n + 1)
        for s in range(0, t - n)
        if tokens[s : s + n] == tokens[t - n :] and tokens[s + n : s + n + len(out)] == out
    ]
    assert hits, (tokens, out)
    assert len(out) <= k


# ----------------------------------------------------------------------------- llama.cpp ngram-simple
def test_simple_most_recent_match() -> None:
    # key [1, 2] (last history token + the sampled one) occurs at 1 and 6: the most recent
    hist = [9, 1, 2, 7, 8, 9, 1, 2, 5, 6, 3, 1]
    assert simple_draft(hist, 2, 2, 3) == [5, 6, 3]


def test_simple_position_zero_never_matches() -> None:
    hist = [1, 2, 7, 8, 9, 5, 6, 3, 4, 1]
    assert simple_draft(hist, 2, 2, 3) == []
    assert simple_draft([0] + hist, 2, 2, 3) == [7, 8, 9]


def test_simple_needs_history_and_a_draft_of_size_n() -> None:
    assert simple_draft([1, 2, 3, 1], 2, 2, 3) == []  # cur_len ≤ n + m + 1
    # the match leaves only 1 token after it (< size_n = 2): no draft
    hist = [0, 0, 0, 0, 0, 0, 0, 4, 1, 2, 5]
    assert simple_draft(hist, 1, 3, 4) == []
    assert simple_draft(hist + [6, 9, 9], 9, 3, 4) == []  # key [9, 9, 9] has no earlier start ≥ 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=2, max_size=50), st.integers(1, 3), st.integers(1, 5))
def test_simple_proposal_continues_the_latest_match(tokens: list[int], n: int, m: int) -> None:
    hist, sampled = tokens[:-1], tokens[-1]
    out = simple_draft(hist, sampled, n, m)
    if not out:
        return
    key = (hist + [sampled])[-n:]
    starts = [j for j in range(1, len(hist) - n) if hist[j : j + n] == key]
    j = max(starts)
    assert out == hist[j + n : j + n + m]
    assert n <= len(out) <= m


# ----------------------------------------------------------------------------- ngram-map-k / k4v
def test_map_k_drafts_after_the_key_and_shortens_to_what_was_accepted() -> None:
    slot = NgramDrafter("ngram-map-k:size_n=2,size_m=3").slot()
    slot.begin([7, 7, 7])
    # [1, 2] first occurs at 3, the prompt's end: not yet searchable
    assert slot.propose([7, 7, 7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2], 10).tokens == []
    d = slot.propose([7, 7, 7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2, 3, 9, 9, 9, 9, 1, 2], 10)
    assert (d.tokens, d.by) == ([3, 9, 9], MAP_K)
    slot.accept(1)  # the next draft for this key is at most 1 token
    d = slot.propose([7, 7, 7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2, 3, 9, 9, 9, 9, 1, 2, 3, 0, 0, 0, 0, 0, 1, 2], 10)
    assert d.tokens == [3]


def test_map_k4v_minimum_hits_and_majority() -> None:
    slot = NgramDrafter("ngram-map-k4v:size_n=1,size_m=1,min_hits=2").slot()
    slot.begin([0])
    h = [0, 5, 1, 8, 8, 8, 5]
    assert slot.propose(h, 10).tokens == []  # [5] at 1 is before the searched range
    h += [1, 8, 8, 8, 5]
    assert slot.propose(h, 10).tokens == []  # found at 6: its first hit, below min_hits
    h += [1, 8, 8, 8, 5]
    # found again, through the hash table (at 6, not the more recent 11): the second hit;
    # the m-gram [1] followed [5] both times
    assert slot.propose(h, 10).tokens == [1]
    slot2 = NgramDrafter("ngram-map-k4v:size_n=1,size_m=1,min_hits=1").slot()
    slot2.begin([0])
    # [5] followed by 1 then 2: neither m-gram is twice as frequent as the other
    assert slot2.propose([0, 5, 1, 8, 8, 5, 2, 8, 8, 8, 5], 10).tokens == []


# ----------------------------------------------------------------------------- ngram-mod
def test_mod_chains_lookups_and_needs_n_min() -> None:
    d = NgramDrafter("ngram-mod:n_match=2,n_min=1,n_max=5")
    slot = d.slot()
    slot.begin([1, 2, 3, 4, 5, 6, 1, 2])
    assert slot.propose([1, 2, 3, 4, 5, 6, 1, 2], 10).tokens == [3, 4, 5, 6, 1]
    strict = NgramDrafter("ngram-mod:n_match=2,n_min=6,n_max=8").slot()
    strict.begin([1, 2, 3, 4, 5, 6, 1, 2])
    # the chain runs [3,4,5,6,1,2,3,4]: 8 ≥ n_min
    assert strict.propose([1, 2, 3, 4, 5, 6, 1, 2], 10).tokens == [3, 4, 5, 6, 1, 2, 3, 4]
    short = NgramDrafter("ngram-mod:n_match=2,n_min=3,n_max=8").slot()
    short.begin([1, 2, 3, 9, 9])
    assert short.propose([1, 2, 3, 9, 9, 7, 1], 10).tokens == []  # [7, 1] never seen


def test_mod_resets_after_five_poor_drafts() -> None:
    d = NgramDrafter("ngram-mod:n_match=2,n_min=1,n_max=4")
    slot = d.slot()
    hist = [1, 2, 3, 4, 5, 1, 2]
    slot.begin(hist)
    for _ in range(5):
        assert slot.propose(hist, 10).tokens
        slot.accept(0)
    assert d._mod_table is not None and d._mod_table.used == 0
    assert slot.propose(hist, 10).tokens == []


# ----------------------------------------------------------------------------- ngram-cache
def test_cache_drafts_the_most_frequent_continuation() -> None:
    slot = NgramDrafter(CACHE).slot()
    assert slot.propose([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 10).tokens == [3, 4, 1, 2, 3, 4, 1, 2]
    fresh = NgramDrafter(CACHE).slot()
    assert fresh.propose([1, 2, 3, 4, 5], 10).tokens == []


# ----------------------------------------------------------------------------- lists and specs
def test_comma_list_runs_in_the_engines_order() -> None:
    d = NgramDrafter("ngram-cache,ngram-simple:size_n=2,size_m=3")
    assert [t.name for t in d.types] == [SIMPLE, CACHE]
    slot = d.slot()
    hist = [9, 1, 2, 7, 8, 9, 1, 2, 5, 6, 3, 1, 2]
    draft = slot.propose(hist, 10)
    assert (draft.tokens, draft.by) == ([5, 6, 3], SIMPLE)
    # nothing for ngram-simple (history too short): ngram-cache drafts
    draft = d.slot().propose([1, 2, 1, 2, 1, 2], 10)
    assert draft.by == CACHE and draft.tokens[:2] == [1, 2]
    assert slot.propose(hist, 2).tokens == [5, 6]  # cut at the cap
    assert d.max_draft() == 8


def test_spec_defaults_and_knobs() -> None:
    (v,) = parse_spec("ngram")
    assert dict(v.knobs) == {"min": 5, "max": 5}
    (v,) = parse_spec("ngram:max=3,k=4")
    assert dict(v.knobs) == {"min": 3, "max": 3, "k": 4}
    (s,) = parse_spec("ngram-simple")
    assert dict(s.knobs) == {"size_n": 12, "size_m": 48, "min_hits": 1}
    (m,) = parse_spec("ngram-mod:n-match=16")
    assert dict(m.knobs) == {"n_match": 16, "n_min": 48, "n_max": 64} and m.name == MOD
    assert NgramDrafter("ngram:min=2,max=4").max_draft(k=6) == 6
    assert is_ngram_spec("ngram-mod,ngram-simple") and is_ngram_spec("ngram:k=3") and not is_ngram_spec("smollm2")


@pytest.mark.parametrize(
    "spec",
    ["ngram:min=4,max=2", "ngram:min=0", "ngram-simple:size_n=0", "ngram-simple:size_m=2000", "ngram-mod:n_match=x", "ngram-cache:size_n=3", "ngram,ngram-simple", "ngram-simple,ngram-simple", "ngram-simple,bogus", "ngram-map-k:foo=1"],
)
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_spec(spec)


def test_what_is_not_implemented_is_refused_by_name() -> None:
    assert is_ngram_spec("suffix:k=4") and is_ngram_spec("ngram_gpu")  # suffix: tests/test_ngram_suffix.py
    with pytest.raises(ConfigError, match="ngram_gpu is not implemented"):
        NgramDrafter("ngram_gpu")
    assert NgramDrafter("sglang-ngram").is_tree  # SGLang's NGRAM: tests/test_ngram_sglang.py


def test_vllm_ngram_without_k_needs_the_runs_k() -> None:
    with pytest.raises(ConfigError):
        NgramDrafter("ngram").max_draft()


def test_matching_is_fast_enough_to_be_a_numpy_scan() -> None:
    rng = np.random.default_rng(0)
    hist = rng.integers(0, 50, 4000).tolist()
    hist += hist[100:130]
    d = NgramDrafter("ngram:min=3,max=5,k=8").slot()
    out = d.propose(hist, 8)
    assert out.tokens == hist[130:138]
