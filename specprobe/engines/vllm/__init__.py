"""vLLM, as specprobe reads it from its source.

Sampling (V1 `Sampler.sample`, `MinPLogitsProcessor`, `apply_top_k_top_p`): temperature →
min-p → top-k → top-p, each on the distribution the previous step left (renormalised).
min-p drops p < min_p · max p; top-k drops logits below the k-th largest (ties with it
are kept, so more than k can survive); top-p sorts ascending, drops tokens whose
ascending cumulative mass is ≤ 1 − top_p and always keeps the most likely one. Greedy
when T < 1e-5 (`_SAMPLING_EPS`).

Drafting and verifying: `speculative_config.draft_sample_method`, default "greedy": the
proposal is the drafter's argmax, a one-hot q for the rejection sampler, so a draft
token is accepted with probability p_target(argmax q); "probabilistic" samples the draft
from q and accepts with min(1, p/q) — acceptance Σ min(p, q).

Vocabularies: a draft model whose vocab_size differs from the target's is refused
('Target and draft model should have the same vocabulary size') unless
`speculative_config.use_heterogeneous_vocab` is true, which masks the drafter's other
tokens and drafts greedily.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specprobe.engines.base import (
    GREEDY,
    VLLM_SAMPLING,
    Engine,
    KnownIssue,
    LiveServer,
    shared_vocab_frac,
)
from specprobe.engines.vllm.client import VllmServer

# vLLM 0.32.0's CPU build: the rejection sampler's CPU fallback for `expand_kernel`
# (vllm/utils/cpu_triton_utils.py) hands the C++ op an int64 copy of its float output,
# so per-token temperature and top_p reach the sampler uninitialised whenever T > 0.
# Measured with a SmolLM2 pair at T = 0.7: 0.1 % of drafts accepted against 8.3 % with
# a pure-torch expand (the project's test harness carries one as a vLLM plugin).
CPU_EXPAND = KnownIssue(
    "vllm-cpu-expand",
    ("0.32.0",),
    "cpu",
    True,
    "vLLM 0.32.0's CPU build leaves the rejection sampler's per-token temperature and top_p uninitialised at T > 0 (its CPU expand_kernel fallback writes into a copy): "
    "served acceptance, and the sampled text, are not the target's distribution",
    "on a CPU server, serve at temperature 0, or replace vllm.utils.cpu_triton_utils' expand fallback (a vllm.general_plugins plugin) until a fixed release",
)


class VLLM(Engine):
    name = "vllm"
    label = "vLLM"
    sampling = VLLM_SAMPLING
    draft_sampling = GREEDY
    knob = "speculative_config.draft_sample_method"
    known_issues = (CPU_EXPAND,)
    # EAGLE-3 heads: the aux layer ids as written index hidden_states (speculators format)
    eagle3_aux_offset = 0
    eagle3_format = "speculators"

    def vocab_findings(self, tt: Any, dt: Any, vt: int, vd: int, tj: Mapping[str, Any], dj: Mapping[str, Any], m: dict[str, Any], ev: dict[str, list[str]]) -> None:
        super().vocab_findings(tt, dt, vt, vd, tj, dj, m, ev)  # both keys, in the order every engine writes them
        bad = vt != vd
        m["engine_vocab_incompatible"] = int(bad)
        differ = bad or m.get("token_id_mismatch_count", 0) > 0
        if bad:
            ev["engine_vocab_incompatible"] = [
                f"vLLM refuses a draft model whose vocab_size differs from the target's (target {vt}, drafter {vd}): "
                "'Target and draft model should have the same vocabulary size' unless speculative_config.use_heterogeneous_vocab is true"
            ]
        if differ:
            frac = shared_vocab_frac(tt, dt, vt)
            m["vocab_shared_frac"] = frac
            ev["vocab_shared_frac"] = [
                f"the vocabularies share {100 * frac:.1f}% of the target's {vt} tokens; with use_heterogeneous_vocab vLLM masks the drafter's other tokens "
                "and drafts greedily (draft_sample_method probabilistic is refused with it)"
            ]
        else:
            m["vocab_shared_frac"] = 1.0

    def live_server(self, url: str, model: str | None = None, timeout: float = 30.0) -> LiveServer:
        return VllmServer(self, url, model, timeout)


ENGINE = VLLM()
