"""Real speculative decoding: the draft→verify loop that measures what `diagnose` estimates.

    rejection  the verify step: accept draft x ~ q with probability min(1, p(x)/q(x)),
               resample from norm(max(0, p − q)) on the first rejection; llama.cpp's
               sample-and-compare (pure maths)
    procedure  how an engine drafts (greedy: the argmax; or sampled) and verifies
    draft_source  `DraftSource`, all the loop knows of a drafter: propose tokens, watch
               the verify pass, take in what it kept
    sources    the sources: a causal LM with its own KV cache (`models.kvcache`), a live
               head drafter, and none (plain decoding)
    counters   vLLM's counters of a run and the rates read off them
    loop       `speculate`: draft → verify → roll back → count → emit, batch by batch
    tree       `speculate_tree` (--tree): each round's draft tree built from real drafter
               forwards, verified in one target pass under a tree attention mask
               (`tree_attention`: transformers' 4-D masks), the accepted path kept
    pipeline   `run_simulate`: diagnose's estimate and this measurement on the same
               prompts, and the result's "measured" block
"""

from specprobe.models.kvcache import Stream, right_align
from specprobe.simulate.counters import SimCounters, SimRun
from specprobe.simulate.draft_source import DraftRule, DraftSource, Proposal
from specprobe.simulate.loop import speculate
from specprobe.simulate.pipeline import eos_ids, measured_section, run_simulate
from specprobe.simulate.procedure import Procedure
from specprobe.simulate.rejection import (
    leading_accepts,
    verify_greedy,
    verify_match,
    verify_sampled,
)
from specprobe.simulate.tree import speculate_tree

__all__ = [
    "DraftRule",
    "DraftSource",
    "Procedure",
    "Proposal",
    "SimCounters",
    "SimRun",
    "Stream",
    "eos_ids",
    "leading_accepts",
    "measured_section",
    "right_align",
    "run_simulate",
    "speculate",
    "speculate_tree",
    "verify_greedy",
    "verify_match",
    "verify_sampled",
]
