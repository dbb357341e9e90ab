"""transformers' assisted generation, as specprobe reads it from its source.

Sampling (`generate`'s warper list: `TemperatureLogitsWarper`, `TopKLogitsWarper`,
`TopPLogitsWarper`, `MinPLogitsWarper`, min_tokens_to_keep = 1): temperature → top-k →
top-p → min-p, each on the renormalised distribution, with the same top-k and top-p
tests as vLLM. Greedy only when do_sample is off (T = 0 here): a generation_config
without `do_sample: true` decodes greedily, and `generate()` fills in top_k 50 where
neither the call nor the checkpoint sets one.

Drafting and verifying: with do_sample the candidates are sampled from the assistant
and verified by speculative sampling (Leviathan et al.): Σ min(p, q). It has no serving
config to export.
"""

from __future__ import annotations

from specprobe.engines.base import PROBABILISTIC, SEQUENTIAL, Engine, SamplingOrder


class Transformers(Engine):
    name = "transformers"
    label = "transformers"
    sampling = SamplingOrder("transformers", SEQUENTIAL, ("top_k", "top_p", "min_p"), greedy_below=0.0, top_k_default=50, greedy_without_do_sample=True)
    draft_sampling = PROBABILISTIC
    knob = "assisted generation (the assistant samples with do_sample)"
    serving_config = False


ENGINE = Transformers()
