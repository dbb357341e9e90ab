"""SGLang, as specprobe reads it from its source.

Sampling (`top_k_top_p_min_p_sampling_from_probs_torch`, and flashinfer's
`top_k_top_p_sampling_from_probs(filter_apply_order="joint")`, its default CUDA path):
temperature, then all three filters on the SAME untruncated distribution (a joint mask):
sort descending, keep the first k positions (exactly k: ties are cut by sort order),
keep tokens whose mass before them is ≤ top_p, keep p ≥ min_p · max p. Greedy when
T < 1e-6. (With min-p set, SGLang's flashinfer path renormalises after top-k before
top-p; the torch path modelled here does not. They differ only when top-k, top-p and
min-p are all set.)

Drafting and verifying: EAGLE / EAGLE-3 / STANDALONE candidates are the drafter's top
tokens; `tree_speculative_sampling_target_only` verifies with the target's
probabilities: a chain accepts its draft with p_target(draft). Its accept thresholds
(`--speculative-accept-threshold-single/-acc`, 1.0 by default) accept more below 1, and
the output is then no longer the target's distribution. It verifies draft trees.

Its HTTP server as a target (`diagnose --target-server`): `client.py`.
"""

from __future__ import annotations

from specprobe.engines.base import GREEDY, JOINT, Engine, LiveServer, SamplingOrder
from specprobe.engines.sglang.client import SglangServer


class SGLang(Engine):
    name = "sglang"
    label = "SGLang"
    monitor_family = "sglang"  # metrics, logs and rules: `monitor.py`
    sampling = SamplingOrder("sglang", JOINT, greedy_below=1e-6)
    draft_sampling = GREEDY
    knob = "its EAGLE candidates (top tokens by draft score)"
    verifies_trees = True
    relaxed_thresholds = True
    # EAGLE-3 heads: it captures the output of layer id, hidden_states[id + 1] (SpecForge's
    # checkpoints and EAGLE's own are trained that way)
    eagle3_aux_offset = 1
    eagle3_default_for_other_formats = True
    ngram_types = ("sglang-ngram",)  # its NGRAM algorithm (a trie, a draft tree)
    serving_knobs = {"accept_threshold_single": "speculative_accept_threshold_single", "accept_threshold_acc": "speculative_accept_threshold_acc"}

    def live_server(self, url: str, model: str | None = None, timeout: float = 30.0) -> LiveServer:
        return SglangServer(self, url, model, timeout)


ENGINE = SGLang()
