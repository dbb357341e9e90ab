"""TensorRT-LLM, as specprobe reads it from its source.

Its draft-target and EAGLE paths propose the drafter's top token and accept it while
the target's own sample agrees (greedy drafting, verified by sample-match). It samples
as vLLM does (temperature, then the truncations one after another) and verifies draft
trees (EAGLE's dynamic trees, Medusa's choices). Its relaxed acceptance for thinking
models (`use_relaxed_acceptance_for_thinking`) is lossy and not what specprobe
estimates: `check` says so when a serving config turns it on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specprobe.engines.base import GREEDY, SAMPLE_MATCH, Engine
from specprobe.engines.vllm import SAMPLING as VLLM_SAMPLING


class TensorRTLLM(Engine):
    name = "trtllm"
    label = "TensorRT-LLM"
    monitor_family = "trtllm"  # its request records: `monitor.py`
    sampling = VLLM_SAMPLING  # the same transform as vLLM's, recorded under vLLM's name as before
    draft_sampling = GREEDY
    knob = "its draft-target / EAGLE decoding config"
    greedy_verify = SAMPLE_MATCH
    verifies_trees = True
    relaxed_acceptance_key = "use_relaxed_acceptance_for_thinking"

    def relaxed_acceptance(self, extra: Mapping[str, Any]) -> bool:
        """Whether a decoding config turns on the relaxed acceptance for thinking models."""
        return str(extra.get(self.relaxed_acceptance_key, "")).lower() in ("true", "1", "yes")


ENGINE = TensorRTLLM()
