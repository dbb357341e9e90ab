"""Drafters that need no model: the engines' n-gram (prompt lookup) speculators,
reimplemented from their source with the same matching rules, tie-breaks, draft lengths,
minimum-hit rules, defaults and knobs. Pure Python and numpy.

Specs (knobs after a colon, comma-separated; every knob has the engine's default):

    ngram[:min=5,max=5,k=K]       vLLM prompt lookup (prompt_lookup_min/max,
                                  num_speculative_tokens; k defaults to the run's K)
    ngram-simple[:size_n=12,size_m=48]               llama.cpp --spec-type ngram-simple
    ngram-map-k[:size_n=12,size_m=48,min_hits=1]     llama.cpp ngram-map-k
    ngram-map-k4v[:size_n=12,size_m=48,min_hits=1]   llama.cpp ngram-map-k4v
    ngram-mod[:n_match=24,n_min=48,n_max=64]         llama.cpp ngram-mod
    ngram-cache                                      llama.cpp ngram-cache (8 tokens)
    sglang-ngram[:num_draft_tokens=12,min_match_window_size=1,max_match_window_size=12,
           min_bfs_breadth=1,max_bfs_breadth=10,match_type=BFS,branch_length=18,
           capacity=10000000]    SGLang's NGRAM (--speculative-ngram-*, and
                                  --speculative-num-draft-tokens); a tree drafter
                                  verified as a tree (`drafters.sglang_ngram`)
    suffix[:max_tree_depth=24,max_cached_requests=10000,max_spec_factor=1.0,
           min_token_prob=0.1,k=K]    vLLM suffix decoding (suffix_decoding_*; k is
                                  num_speculative_tokens, vLLM's default the tree depth;
                                  `drafters.suffix`)

and llama.cpp's comma lists of types, e.g. `ngram-simple:size_n=4,ngram-mod`: the types
are tried in the engine's priority order (simple, map-k, map-k4v, mod, cache), whatever
order they were written in, and the first that drafts anything drafts this step. A draft
model after them (`types+model`, llama.cpp's `-md` with draft-simple in the list) drafts
only when none did: `drafters.ngram_mix`.

How the engines call them, and so how `Slot.propose` is called: after each verify step,
with the sequence so far (prompt + accepted tokens) whose last token is the one just
sampled, and a cap on the draft (llama-server: at most n_remaining − 1 tokens; a longer
draft is cut, `common_speculative_draft`). `Slot.accept` tells the type that drafted how
many of its drafts were accepted (ngram-map-* shorten later drafts of that key to it;
ngram-mod resets its table after five drafts in a row with under a quarter accepted).

State: a `Slot` is one sequence's drafter, as one llama-server slot keeps it across the
requests it serves (`begin` at each new request). ngram-mod's hash table is shared by
every slot of one `NgramDrafter` (the server's one table for all sequences).

Known departures: llama.cpp's ngram-cache picks the most frequent next token with a
strict `>` over a `std::unordered_map`; among equal counts the engine takes whichever
its hash table iterates first, this module the most recently added token. Static and
dynamic lookup-cache files (--lookup-cache-static/-dynamic) are not read."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specprobe.core.errors import ConfigError
from specprobe.drafters.sglang_ngram import DEFAULTS as SGLANG_DEFAULTS
from specprobe.drafters.sglang_ngram import MATCH_TYPES, NgramTree, SglangSlot, TrieCache, check
from specprobe.drafters.suffix import SuffixCache, SuffixSlot
from specprobe.engines import ngram_engine

VLLM_NGRAM = "ngram"
SIMPLE, MAP_K, MAP_K4V, MOD, CACHE = "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"
SUFFIX = "suffix"  # vLLM's suffix decoding (drafters.suffix)
SGLANG = "sglang-ngram"  # SGLang's NGRAM, a tree drafter (drafters.sglang_ngram)
VLLM_METHODS = (VLLM_NGRAM, SUFFIX)  # one method per vLLM server: never in a list
SINGLE = (*VLLM_METHODS, SGLANG)  # one method per server (only llama.cpp lists types)
# llama.cpp's priority (common_speculative_init): the first listed that drafts, drafts
LLAMA_CPP_ORDER = (SIMPLE, MAP_K, MAP_K4V, MOD, CACHE)
TYPES = (VLLM_NGRAM, *LLAMA_CPP_ORDER, SUFFIX, SGLANG)

# knob -> (default, low, high) as each engine's argument parser bounds it
_KNOBS: dict[str, dict[str, tuple[int | float | None, int, int | None]]] = {
    VLLM_NGRAM: {"min": (None, 1, None), "max": (None, 1, None), "k": (None, 1, None)},
    SIMPLE: {"size_n": (12, 1, 1024), "size_m": (48, 1, 1024), "min_hits": (1, 1, None)},
    MAP_K: {"size_n": (12, 1, 1024), "size_m": (48, 1, 1024), "min_hits": (1, 1, None)},
    MAP_K4V: {"size_n": (12, 1, 1024), "size_m": (48, 1, 1024), "min_hits": (1, 1, None)},
    MOD: {"n_match": (24, 1, 1024), "n_min": (48, 0, 1024), "n_max": (64, 0, 1024)},
    CACHE: {},
    # vLLM's SpeculativeConfig defaults and its _validate_suffix_decoding bounds
    SUFFIX: {"max_tree_depth": (24, 1, None), "max_cached_requests": (10000, 0, None), "max_spec_factor": (1.0, 0, None), "min_token_prob": (0.1, 0, 1), "k": (None, 1, None)},
    # SGLang's server_args defaults; the C++ cache's own checks follow (sglang_ngram.check)
    SGLANG: {
        "min_match_window_size": (1, 1, None), "max_match_window_size": (12, 1, None), "min_bfs_breadth": (1, 1, None), "max_bfs_breadth": (10, 1, None),
        "match_type": (0, 0, None), "branch_length": (18, 2, None), "capacity": (10_000_000, 1, None), "num_draft_tokens": (12, 2, None),
    },
}  # fmt: skip
_FLOAT_KNOBS = frozenset({"max_spec_factor", "min_token_prob"})
VLLM_DEFAULT_LOOKUP = 5  # prompt_lookup_min = prompt_lookup_max = 5 when neither is given
CACHE_N_DRAFT = 8  # llama.cpp's ngram-cache drafts up to 8 tokens (not configurable)
MOD_TABLE_SIZE = 4 * 1024 * 1024  # ngram-mod's hash table entries
MOD_OCCUPANCY_RESET = 0.25  # begin(): a table fuller than this is cleared
MAP_HASH_SIZE = 262144  # ngram-map's n-gram hash -> position table (COMMON_NGRAM_HASH_MAP_SIZE)
MAP_MAX_VALUES = 4  # m-grams kept per key (COMMON_NGRAM_MAX_VALUES)
MAP_MAX_COUNT = 16380  # counts saturate here (COMMON_NGRAM_MAX_VALUE_COUNT)
_HINT = "use ngram[:min=N,max=N,k=N], suffix[:max_tree_depth=N,max_spec_factor=X,min_token_prob=X,k=N], sglang-ngram[:num_draft_tokens=N,match_type=BFS|PROB,…], ngram-simple, ngram-map-k, ngram-map-k4v (knobs size_n, size_m, min_hits), ngram-mod (n_match, n_min, n_max), ngram-cache, or a comma list of llama.cpp types"


NOT_IMPLEMENTED = {
    "ngram_gpu": "vLLM's ngram_gpu is not implemented under its own name",
}


def is_ngram_spec(spec: str) -> bool:
    """Whether a drafter spec names an n-gram drafter (no model to load; n-gram types
    beside a draft model, `types+model`, are `drafters.ngram_mix`'s)."""
    if "+" in spec:
        return False
    head = spec.split(":", 1)[0].split(",", 1)[0].strip().lower()
    return head in TYPES or head in NOT_IMPLEMENTED


# ----------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class NgramType:
    """One engine type and its knobs (every knob filled in with its default)."""

    name: str
    knobs: tuple[tuple[str, int | float], ...]

    def get(self, key: str) -> int:
        return int(dict(self.knobs)[key])

    def getf(self, key: str) -> float:
        return float(dict(self.knobs)[key])

    @property
    def max_draft(self) -> int | None:
        """The longest draft it makes (None: the run's K, vLLM's num_speculative_tokens)."""
        if self.name == VLLM_NGRAM:
            k = dict(self.knobs).get("k")
            return None if k is None else int(k)
        if self.name == SGLANG:  # the tree's nodes below the root (num_draft_tokens counts the root)
            return self.get("num_draft_tokens") - 1
        if self.name == SUFFIX:  # vLLM: num_speculative_tokens defaults to the tree depth
            return self.get("k") if "k" in dict(self.knobs) else self.get("max_tree_depth")
        if self.name == MOD:
            return max(0, self.get("n_max"))
        if self.name == CACHE:
            return CACHE_N_DRAFT
        return self.get("size_m")

    def label(self) -> str:
        kv = ",".join(f"{k}={v}" for k, v in self.knobs)
        return f"{self.name}:{kv}" if kv else self.name


def parse_spec(spec: str) -> tuple[NgramType, ...]:
    """A drafter spec -> its types in the order the engine tries them; ConfigError when it
    is not one (see module doc)."""
    head = spec.split(":", 1)[0].split(",", 1)[0].strip().lower()
    if head in NOT_IMPLEMENTED:
        raise ConfigError(f"drafter {spec}: {NOT_IMPLEMENTED[head]}", "use ngram[:min=…,max=…,k=…] (vLLM's prompt lookup) or one of llama.cpp's ngram-* types")
    items = [s.strip() for s in spec.split(",")]
    groups: list[tuple[str, list[str]]] = []
    for item in items:
        name, _, first = item.partition(":")
        if name.strip().lower() in TYPES:
            groups.append((name.strip().lower(), [first] if first else []))
        elif "=" in item and groups:
            groups[-1][1].append(item)
        else:
            raise ConfigError(f"drafter spec {spec!r}: {item!r} is neither an n-gram type nor a knob", _HINT)
    names = [g[0] for g in groups]
    single = [n for n in names if n in SINGLE]
    if single and len(names) > 1:
        engine = "SGLang" if single[0] == SGLANG else "vLLM"
        raise ConfigError(f"drafter spec {spec!r} mixes {engine}'s '{single[0]}' with other types", f"{engine} runs one method; lists of types are llama.cpp's --spec-type")
    if len(set(names)) < len(names):
        raise ConfigError(f"drafter spec {spec!r} names a type twice", "name each type once")
    types = [_type(spec, name, kv) for name, kv in groups]
    return tuple(sorted(types, key=lambda t: TYPES.index(t.name)))


def _type(spec: str, name: str, pairs: list[str]) -> NgramType:
    allowed = _KNOBS[name]
    given: dict[str, int | float] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not eq or key not in allowed:
            known = ", ".join(allowed) or "none"
            raise ConfigError(f"drafter spec {spec!r}: {name} has no knob {pair.strip()!r}", f"its knobs: {known}")
        if name == SGLANG and key == "match_type":
            if value.strip().upper() not in MATCH_TYPES:
                raise ConfigError(f"drafter spec {spec!r}: {name} match_type={value.strip()!r} is neither BFS nor PROB", "give match_type=BFS or match_type=PROB")
            given[key] = value.strip().upper()  # type: ignore[assignment]
            continue
        real = key in _FLOAT_KNOBS
        if not re.fullmatch(r"-?\d+(\.\d*)?|-?\.\d+" if real else r"-?\d+", value.strip()):
            raise ConfigError(f"drafter spec {spec!r}: {name} {key}={value.strip()!r} is not a {'number' if real else 'whole number'}", "give a number" if real else "give an integer")
        _, low, high = allowed[key]
        v: int | float = float(value) if real else int(value)
        if v < low or (high is not None and v > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ConfigError(f"drafter spec {spec!r}: {name} {key}={v} is out of range", f"the engine takes {key} {bound}")
        given[key] = v
    if name == VLLM_NGRAM:
        lo, hi = given.get("min"), given.get("max")
        # vLLM's SpeculativeConfig: neither given -> 5/5; one given -> the other mirrors it
        lo, hi = (VLLM_DEFAULT_LOOKUP, VLLM_DEFAULT_LOOKUP) if lo is None and hi is None else (lo if lo is not None else hi, hi if hi is not None else lo)
        assert lo is not None and hi is not None
        if lo > hi:
            raise ConfigError(f"drafter spec {spec!r}: min={lo} is above max={hi}", "vLLM needs prompt_lookup_min ≤ prompt_lookup_max")
        knobs = [("min", lo), ("max", hi)] + ([("k", given["k"])] if "k" in given else [])
        return NgramType(name, tuple(knobs))
    if name == SGLANG:
        filled: dict[str, Any] = {k: given.get(k, SGLANG_DEFAULTS[k]) for k in SGLANG_DEFAULTS}
        why = check(filled)
        if why:
            raise ConfigError(f"drafter spec {spec!r}: {why}", "SGLang's n-gram cache refuses it (cpp_ngram: Ngram::Ngram)")
        return NgramType(name, tuple(filled.items()))
    knobs2 = [(k, given.get(k, d)) for k, (d, _, _) in allowed.items() if d is not None]
    if name == SUFFIX and "k" in given:
        knobs2.append(("k", given["k"]))
    return NgramType(name, tuple((k, v) for k, v in knobs2 if v is not None))


# ----------------------------------------------------------------------------- vLLM
def vllm_propose(tokens: Sequence[int] | np.ndarray, min_n: int, max_n: int, k: int, max_model_len: int | None = None) -> list[int]:
    """vLLM's prompt lookup (`_find_longest_matched_ngram_and_propose_tokens`): the
    longest n in [min_n, max_n] whose last n tokens occur earlier in the context (the
    occurrence ends before the last token), the earliest such occurrence, and up to k
    tokens that followed it (fewer when the context ends first). The context includes
    the token just sampled."""
    arr = np.asarray(tokens, dtype=np.int64)
    total = int(arr.shape[0])
    if total < min_n:
        return []
    if max_model_len is not None:
        k = min(k, max_model_len - total)
    if k <= 0 or total < 2:
        return []
    ends = np.flatnonzero(arr[:-1] == arr[-1])  # occurrences' last tokens, before the last
    if ends.size == 0:
        return []
    length = np.ones(ends.shape[0], dtype=np.int64)
    alive = np.ones(ends.shape[0], dtype=bool)
    for back in range(1, max_n):
        pos = ends - back
        ok = alive & (pos >= 0)
        ok[ok] = arr[pos[ok]] == arr[total - 1 - back]
        alive = ok
        if not alive.any():
            break
        length += alive
    best = int(length.max())
    if best < min_n:
        return []
    end = int(ends[np.flatnonzero(length == best)[0]])  # the earliest of the longest
    start = end + 1
    return [int(x) for x in arr[start : start + min(k, total - start)]]


# ----------------------------------------------------------------------------- llama.cpp
def simple_draft(tokens: Sequence[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    """llama.cpp's `common_ngram_simple_draft`: the key is the last size_n − 1 tokens and
    the one just sampled; the most recent earlier occurrence of it (searched from
    cur_len − size_n − 1 down to position 1; position 0 never matches) gives the up to
    size_m tokens after it, and a draft shorter than size_n is no draft. Needs more than
    size_n + size_m + 1 tokens of history."""
    arr = np.asarray(tokens, dtype=np.int64)
    cur = int(arr.shape[0])
    n, m = size_n, size_m
    if cur <= n + m + 1:
        return []
    pattern = np.concatenate([arr[cur - n + 1 :], np.asarray([sampled], dtype=np.int64)])
    hi = cur - n - 1  # the last start searched
    cand = np.flatnonzero(arr[1 : hi + 1] == pattern[0]) + 1  # starts in [1, hi]
    match = 0
    for j in cand[::-1]:  # most recent first
        if np.array_equal(arr[j : j + n], pattern):
            match = int(j)
            break
    if match == 0:
        return []
    copy = min(m, cur - (match + n))
    if copy < n:
        return []
    return [int(x) for x in arr[match + n : match + n + copy]]


def _lcg_hash(tokens: Sequence[int], start: int, length: int) -> int:
    """ngram-map's 32-bit LCG hash of tokens[start:start+length]."""
    h = 0
    for i in range(length):
        h = (h * 2654435761 + int(tokens[start + i])) & 0xFFFFFFFF
    return h


@dataclass
class _MapValue:
    value_idx: int = 0  # where the m-gram starts in the history (0: unused slot)
    value_num: int = 0  # times it followed the key
    n_accepted: int = -1  # accepted tokens at its last draft


@dataclass
class _MapKey:
    key_idx: int
    stat_idx: int = 0
    key_num: int = 0
    values: list[_MapValue] = field(default_factory=lambda: [_MapValue() for _ in range(MAP_MAX_VALUES)])


class NgramMap:
    """llama.cpp's `common_ngram_map` (ngram-map-k: keys only; ngram-map-k4v: keys and up
    to four m-grams after each), one slot's state: the key n-grams seen, the m-grams that
    followed them, a hash table from n-gram to position, and what was accepted."""

    def __init__(self, size_n: int, size_m: int, key_only: bool, min_hits: int) -> None:
        self.n, self.m, self.key_only, self.min_hits = size_n, size_m, key_only, min_hits
        self.keys: list[_MapKey] = []
        self.key_map: dict[int, int] = {}  # hash bucket -> position (absent: 0)
        self.key_map_last_idx = 0
        self.size_last_begin = 0
        self.idx_last_check = 0
        self.last: tuple[int, int] | None = None  # (key offset, value slot) of the last draft

    def begin(self, prompt: Sequence[int]) -> None:
        """`common_ngram_map_begin`: a new request; what came after the previous one's
        prompt (or, when the new history is shorter, after its new end) is forgotten."""
        size_begin = len(prompt)
        n, m = self.n, self.m
        cleanup = self.size_last_begin
        if cleanup > size_begin:
            cleanup = size_begin - n - m if size_begin > n + m else 0
        if size_begin < self.idx_last_check:
            self.key_map = {h: i for h, i in self.key_map.items() if i < cleanup}
            self.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            if self.keys:
                kept: list[_MapKey] = []
                for key in self.keys:
                    if key.key_idx >= cleanup:
                        continue
                    if not self.key_only:
                        vals = [v for v in key.values if not (v.value_idx != 0 and v.value_idx >= cleanup)]
                        key.values = vals + [_MapValue(n_accepted=v.n_accepted) for v in key.values[len(vals) :]]
                        if key.values[0].value_idx == 0:
                            continue
                    kept.append(key)
                self.keys = kept
        self.idx_last_check = size_begin
        self.size_last_begin = size_begin

    def _match(self, inp: Sequence[int], j: int, key: Sequence[int]) -> bool:
        return all(inp[j + k] == key[k] for k in range(self.n))

    def draft(self, inp: Sequence[int], sampled: int) -> list[int]:
        """`common_ngram_map_draft` over the history inp (without the sampled token)."""
        self.last = None
        cur, n, m = len(inp), self.n, self.m
        if cur < 2 * n + m:
            return []
        self.idx_last_check = cur
        key = [int(x) for x in inp[cur - n + 1 :]] + [int(sampled)]
        top = cur - n - m - 1  # the last position a key may start at
        match = 0
        idx_key = self.key_map.get(_lcg_hash(key, 0, n) % MAP_HASH_SIZE, 0)
        if idx_key != 0 and idx_key < top and self._match(inp, idx_key, key):
            match = idx_key
        if match == 0 and self.size_last_begin > n + m + 1:
            for j in range(self.size_last_begin - n - m - 1, self.key_map_last_idx, -1):
                if self._match(inp, j, key):
                    match = j
                    break
        if match == 0:
            for j in range(top, max(self.size_last_begin, self.key_map_last_idx), -1):
                if self._match(inp, j, key):
                    match = j
                    break
        # hash the n-grams not hashed yet, in the same order (a bucket keeps its first)
        spans = []
        if self.size_last_begin > n + m + 1:
            spans.append(range(self.size_last_begin - n - m - 1, self.key_map_last_idx, -1))
        spans.append(range(top, max(self.size_last_begin, self.key_map_last_idx), -1))
        for span in spans:
            for j in span:
                self.key_map.setdefault(_lcg_hash(inp, j, n) % MAP_HASH_SIZE, j)
        self.key_map_last_idx = max(top, self.key_map_last_idx)
        if match == 0:
            return []

        offset = next((i for i, k in enumerate(self.keys) if self._match(inp, k.key_idx, key)), len(self.keys))
        if offset == len(self.keys):
            self.keys.append(_MapKey(key_idx=match, values=[_MapValue(n_accepted=m) for _ in range(MAP_MAX_VALUES)]))
        cur_key = self.keys[offset]
        cur_key.key_num = min(cur_key.key_num + 1, MAP_MAX_COUNT)
        if self.key_only:
            # keys only: the m tokens after the match, no longer than the last accepted
            count = min(m, cur_key.values[0].n_accepted)
            self.last = (offset, 0)
            return [int(inp[match + n + i]) for i in range(count)]
        if cur_key.key_num < self.min_hits:
            return []
        # count the m-grams after every occurrence of the key up to the match
        for i in range(cur_key.stat_idx, match + 1):
            if not self._match(inp, i, key):
                continue
            begin = i + n
            slot = -1
            for v, val in enumerate(cur_key.values):
                if val.value_idx == 0:
                    val.value_idx, val.value_num, val.n_accepted = begin, 0, m
                    slot = v
                    break
                if all(inp[begin + j] == inp[val.value_idx + j] for j in range(m)):
                    slot = v
                    break
            if slot >= 0:
                cur_key.values[slot].value_num = min(cur_key.values[slot].value_num + 1, MAP_MAX_COUNT)
        cur_key.stat_idx = match
        counts = [v.value_num for v in cur_key.values]
        slot_max, max_occur = 0, 0
        for v, c in enumerate(counts):
            if c > max_occur:
                slot_max, max_occur = v, c
        others = sum(counts) - counts[slot_max]
        if others > 0 and max_occur < 2 * others:
            return []  # the most frequent m-gram is not twice as frequent as the rest
        # as the engine does: the tokens after this match, at most the slot's last accepted
        count = min(m, cur_key.values[slot_max].n_accepted)
        self.last = (offset, slot_max)
        return [int(inp[match + n + i]) for i in range(count)]

    def accept(self, n_accepted: int) -> None:
        """`common_ngram_map_accept`: the value used remembers how many were accepted."""
        if self.last is None:
            return
        key, slot = self.last
        self.keys[key].values[slot].n_accepted = n_accepted


_MASK64 = (1 << 64) - 1


class NgramModTable:
    """llama.cpp's `common_ngram_mod`: a 4M-entry table from an n-gram's 64-bit LCG hash
    to the token that last followed it (-1: empty); collisions overwrite."""

    def __init__(self, n: int, size: int = MOD_TABLE_SIZE) -> None:
        self.n = n
        self.entries = np.full(size, -1, dtype=np.int32)
        self.used = 0

    def idx(self, tokens: Sequence[int], start: int) -> int:
        res = 0
        for i in range(self.n):
            res = (res * 6364136223846793005 + int(tokens[start + i])) & _MASK64
        return res % self.entries.shape[0]

    def add(self, tokens: Sequence[int], start: int) -> None:
        i = self.idx(tokens, start)
        if self.entries[i] == -1:
            self.used += 1
        self.entries[i] = int(tokens[start + self.n])

    def get(self, tokens: Sequence[int], start: int) -> int:
        return int(self.entries[self.idx(tokens, start)])

    def reset(self) -> None:
        self.entries.fill(-1)
        self.used = 0


class NgramMod:
    """One slot of llama.cpp's ngram-mod over the shared table: the prompt's n-grams are
    added at begin, generated ones in chunks (once 32 tokens are new); a draft chains
    table lookups from the last n_match tokens and is kept only with ≥ n_min tokens."""

    def __init__(self, table: NgramModTable, n_min: int, n_max: int) -> None:
        self.table, self.n_min, self.n_max = table, n_min, n_max
        self.i_last = 0
        self.n_draft_last = 0
        self.n_low = 0

    def begin(self, prompt: Sequence[int]) -> None:
        self.i_last = 0
        self.n_draft_last = 0
        n = self.table.n
        if len(prompt) < n:
            return
        for i in range(len(prompt) - n):
            self.table.add(prompt, i)
        self.i_last = len(prompt) - n
        if self.table.used / self.table.entries.shape[0] > MOD_OCCUPANCY_RESET:
            self.table.reset()

    def draft(self, inp: Sequence[int], sampled: int) -> list[int]:
        self.n_draft_last = 0
        cur, n = len(inp), self.table.n
        if cur < n:
            return []
        if self.i_last + 32 < cur:
            for i in range(self.i_last, cur - n):
                self.table.add(inp, i)
            self.i_last = cur - n
        result = [int(x) for x in inp[cur - n + 1 :]] + [int(sampled)]
        for i in range(self.n_max):
            token = self.table.get(result, i)
            if token == -1:
                if i < self.n_min:
                    return []
                break
            result.append(token)
        out = result[n:]
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < 0.25:
                self.n_low += 1
                if self.n_low >= 5:
                    self.table.reset()
                    self.n_low = 0
                    self.i_last = 0
            else:
                self.n_low = 0


# ngram-cache: minimum sample size and share of the most frequent next token, per n-gram size 1..4
_LAX_SIZE, _LAX_PCT = (2, 2, 1, 1), (66, 50, 50, 50)
_CACHE_MIN, _CACHE_MAX = 1, 4


class NgramCache:
    """llama.cpp's ngram-cache (the lookup decoding of `common_ngram_cache_*`): counts of
    the token after every 1..4-gram of the context; a draft grows one token at a time
    from the longest n-gram whose most frequent next token has enough samples and share
    (the lax thresholds), up to 8 tokens. The context cache is updated with each call's
    new tokens alone: n-grams across the boundary with the previous call are not counted."""

    def __init__(self) -> None:
        self.context: dict[tuple[int, ...], dict[int, int]] = {}
        self.cache_size = 0

    def begin(self, prompt: Sequence[int]) -> None:
        pass  # the engine keeps the slot's cache and its size across requests

    def _update(self, inp: list[int]) -> None:
        for size in range(_CACHE_MIN, _CACHE_MAX + 1):
            for i in range(size, len(inp)):
                part = self.context.setdefault(tuple(inp[i - size : i]), {})
                part[inp[i]] = part.get(inp[i], 0) + 1

    def draft(self, inp: Sequence[int], sampled: int) -> list[int]:
        if self.cache_size < len(inp) + 1:
            self._update([int(x) for x in inp[self.cache_size :]] + [int(sampled)])
            self.cache_size = len(inp) + 1
        seq = [int(x) for x in inp] + [int(sampled)]
        size = len(seq)
        if size < 2:
            return []
        draft: list[int] = []
        while len(draft) < CACHE_N_DRAFT:
            tok = None
            full = seq + draft
            end = size + len(draft)
            for i in range(min(_CACHE_MAX, end) - 1, -1, -1):  # the longest n-gram first
                part = self.context.get(tuple(full[end - (i + 1) : end]))
                if part is None:
                    continue
                best, best_count, total = None, 0, 0
                for t in reversed(part):  # see the module doc on ties
                    c = part[t]
                    if c > best_count:
                        best, best_count = t, c
                    total += c
                if total < _LAX_SIZE[i] or 100 * best_count < _LAX_PCT[i] * total:
                    continue
                tok = best
                break
            if tok is None:
                break
            draft.append(tok)
        return draft

    def accept(self, n_accepted: int) -> None:
        pass


# ----------------------------------------------------------------------------- drafter and slots
@dataclass
class Draft:
    """One proposal: its tokens, which type made it and the seconds its matching took."""

    tokens: list[int]
    by: str | None
    seconds: float
    tree: NgramTree | None = None  # SGLang's NGRAM: the tree it verifies (tokens stay empty)


class NgramDrafter:
    """A parsed n-gram drafter spec: its types in the engine's order and the state they
    share (ngram-mod's table). `slot()` opens one sequence's drafter."""

    kind = "ngram"
    num_layers = 0
    params = 0

    def __init__(self, spec: str, max_model_len: int | None = None, info: Any = None) -> None:
        self.spec = spec
        self.types = parse_spec(spec)
        self.max_model_len = max_model_len
        self.info = info  # the target's (its tokens are the target's own), when paired with one
        self.engine = ngram_engine(self.types[0].name).name
        mod = next((t for t in self.types if t.name == MOD), None)
        self._mod_table = NgramModTable(mod.get("n_match")) if mod is not None else None
        self._requests = 0
        self._suffix: SuffixCache | None = None
        self._trie: TrieCache | None = None
        self.reset()

    @property
    def is_tree(self) -> bool:
        """Whether it drafts a tree that the engine verifies as one (SGLang's NGRAM)."""
        return self.types[0].name == SGLANG

    def reset(self) -> None:
        """A fresh server: suffix decoding's global cache of responses emptied (each pass
        over the prompt set starts from none, its requests seen in the set's order)."""
        sfx = next((t for t in self.types if t.name == SUFFIX), None)
        if sfx is not None:
            self._suffix = SuffixCache(sfx.get("max_tree_depth"), sfx.get("max_cached_requests"))
        sg = next((t for t in self.types if t.name == SGLANG), None)
        if sg is not None:  # the server's one trie, empty
            kn = dict(sg.knobs)
            self._trie = TrieCache(int(kn["capacity"]), int(kn["min_match_window_size"]), int(kn["max_match_window_size"]), int(kn["branch_length"]), int(kn["min_bfs_breadth"]), int(kn["max_bfs_breadth"]), str(kn["match_type"]))

    def _new_request(self) -> int:
        self._requests += 1
        return self._requests

    @property
    def name(self) -> str:
        return ",".join(t.label() for t in self.types)

    def max_draft(self, k: int | None = None) -> int:
        """The longest draft any of its types makes; vLLM's `ngram` without k= drafts the
        run's K (num_speculative_tokens)."""
        lengths = [t.max_draft if t.max_draft is not None else k for t in self.types]
        if any(x is None for x in lengths):
            raise ConfigError(f"drafter {self.spec} needs a draft length", "give k= in the spec (vLLM's num_speculative_tokens) or --k")
        return max(int(x) for x in lengths if x is not None)

    def slot(self, k: int | None = None) -> Slot:
        return Slot(self, k)


class Slot:
    """One sequence's n-gram drafter (see module doc)."""

    def __init__(self, drafter: NgramDrafter, k: int | None = None) -> None:
        self.drafter = drafter
        self.impls: list[tuple[str, Any]] = []
        for t in drafter.types:
            if t.name in (VLLM_NGRAM, SIMPLE):
                self.impls.append((t.name, None))  # stateless
            elif t.name in (MAP_K, MAP_K4V):
                self.impls.append((t.name, NgramMap(t.get("size_n"), t.get("size_m"), t.name == MAP_K, t.get("min_hits"))))
            elif t.name == SUFFIX:
                assert drafter._suffix is not None
                self.impls.append((t.name, SuffixSlot(drafter._suffix, t.max_draft or 1, t.getf("max_spec_factor"), t.getf("min_token_prob"), drafter.max_model_len, drafter._new_request)))
            elif t.name == SGLANG:
                assert drafter._trie is not None
                self.impls.append((t.name, SglangSlot(drafter._trie, t.get("num_draft_tokens"))))
            elif t.name == MOD:
                assert drafter._mod_table is not None
                self.impls.append((t.name, NgramMod(drafter._mod_table, t.get("n_min"), t.get("n_max"))))
            else:
                self.impls.append((t.name, NgramCache()))
        self.k = k
        self.last_by: int | None = None  # which impl drafted last (llama.cpp's impl_last)

    def begin(self, prompt: Sequence[int]) -> None:
        """A new request after its prompt was processed."""
        for _, impl in self.impls:
            if impl is not None:
                impl.begin(prompt)

    def propose(self, history: Sequence[int], n_max: int) -> Draft:
        """Drafts after `history` (prompt + verified tokens, the last one just sampled),
        at most n_max of them."""
        t0 = time.perf_counter()
        out: list[int] = []
        by = None
        if self.impls[0][0] == SGLANG:  # a tree every step, a match or not (padded)
            tree = self.impls[0][1].propose_tree(history)
            self.last_by = 0
            return Draft([], SGLANG if tree.real else None, time.perf_counter() - t0, tree)
        self.observe(history)  # suffix decoding takes in every sampled token, drafting or not
        if n_max > 0 and len(history) > 0:
            hist = history if isinstance(history, list) else list(history)
            inp, sampled = hist[:-1], hist[-1]
            for i, (name, impl) in enumerate(self.impls):
                t = self.drafter.types[i]
                if name == VLLM_NGRAM:
                    k = t.max_draft if t.max_draft is not None else (self.k or n_max)
                    out = vllm_propose(hist, t.get("min"), t.get("max"), k, self.drafter.max_model_len)
                elif name == SIMPLE:
                    out = simple_draft(inp, sampled, t.get("size_n"), t.get("size_m"))
                elif name == SUFFIX:
                    out = impl.propose(hist)
                else:
                    out = impl.draft(inp, sampled)
                if out:
                    by = i
                    break
            out = out[:n_max]
        if by is not None:
            self.last_by = by
        return Draft(out, None if by is None else self.impls[by][0], time.perf_counter() - t0)

    def observe(self, history: Sequence[int]) -> None:
        """The sequence so far (suffix decoding adds what it has not seen to its trees)."""
        for _, impl in self.impls:
            if isinstance(impl, SuffixSlot):
                impl.observe(history)

    def finish(self, history: Sequence[int]) -> None:
        """The request ended with `history` (suffix decoding keeps its whole response)."""
        for _, impl in self.impls:
            if isinstance(impl, (SuffixSlot, SglangSlot)):
                impl.finish(history)

    def accept(self, n_accepted: int) -> None:
        """How many of the last draft's tokens verify accepted (called only after a draft)."""
        if self.last_by is None:
            return
        name, impl = self.impls[self.last_by]
        if impl is not None:
            impl.accept(n_accepted)
