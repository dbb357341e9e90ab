"""llama.cpp's llama-server, as specprobe reads it from its source.

Sampling (`common_params_sampling.samplers`, built into a chain by
`common_sampler_init`; the samplers in src/llama-sampler.cpp): penalties → dry →
top-n-sigma → top-k → typical-p → top-p → min-p → xtc → temperature → dist: the
truncations act on the UNTEMPERED distribution and the temperature divides the surviving
logits last. top-k keeps exactly k (sorted; ties with the k-th cut by sort order); top-p
takes the softmax of what top-k left, descending, and keeps the shortest prefix whose
mass reaches top_p (the crossing token included); min-p keeps logits ≥ max +
log(min_p), i.e. p ≥ min_p · max p. Greedy when T ≤ 0. (Typical-p, XTC, DRY and
top-n-sigma are off by default and not modelled; llama.cpp's own defaults top_k 40,
top_p 0.95, min_p 0.05, T 0.8 apply only where neither the request nor a flag sets them.)

Drafting and verifying: `--spec-type draft-simple` drafts the drafter's top token, then
samples the target at each draft position with the request's sampler chain and accepts
while the sample equals the draft: p_target(draft). Its draft sampler keeps the
drafter's 10 best tokens at temperature 1 (LLAMA_DRAFT_TOP_K in common/speculative.cpp);
`--spec-draft-p-min P` stops drafting before the first draft token whose probability
there is below P (adaptive K with the engine's own knob), and `--spec-draft-n-min`
drops drafts shorter than N. An n-gram draft stops at an end-of-generation token.

Vocabularies: `common_speculative_are_compatible` compares the vocab type, BOS and EOS
(where added), the sizes (at most SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128 apart) and the
text of every id from SPEC_VOCAB_CHECK_START_TOKEN_ID = 5 up to the smaller vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specprobe.engines.base import GREEDY, SAMPLE_MATCH, UNTEMPERED, Engine, SamplingOrder

# common/speculative.cpp: SPEC_VOCAB_MAX_SIZE_DIFFERENCE, SPEC_VOCAB_CHECK_START_TOKEN_ID
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5
MAX_EXAMPLES = 5  # evidence lines kept per finding
# its draft sampler keeps the drafter's 10 best tokens (LLAMA_DRAFT_TOP_K) at temperature 1
DRAFT_TOP_K = 10


class LlamaCpp(Engine):
    name = "llama.cpp"
    label = "llama.cpp"
    monitor_family = "llamacpp"  # metrics, logs and rules: `monitor.py`
    sampling = SamplingOrder("llama.cpp", UNTEMPERED, greedy_below=0.0)
    draft_sampling = GREEDY
    knob = "--spec-type draft-simple (the drafter's top token)"
    adaptive_knob = "--spec-draft-p-min"
    greedy_verify = SAMPLE_MATCH
    confidence_top_n = DRAFT_TOP_K
    draft_stops = True
    drafts_stop_at_end_of_generation = True
    serving_knobs = {"draft_p_min": "p_min", "draft_n_min": "n_min"}
    ngram_default = True  # its ngram-* types (--spec-type), and a draft model beside them
    ngram_with_draft_model = True

    def vocab_findings(self, tt: Any, dt: Any, vt: int, vd: int, tj: Mapping[str, Any], dj: Mapping[str, Any], m: dict[str, Any], ev: dict[str, list[str]]) -> None:
        super().vocab_findings(tt, dt, vt, vd, tj, dj, m, ev)  # both keys, in the order every engine writes them
        problems = vocab_problems(tt, dt, vt, vd, tj, dj)
        m["engine_vocab_incompatible"] = int(bool(problems))
        if problems:
            ev["engine_vocab_incompatible"] = [f"llama.cpp common_speculative_are_compatible fails: {p}" for p in problems[:MAX_EXAMPLES]] + [
                "llama-server's draft-simple then refuses the drafter ('draft model vocab type must match target model'); "
                "builds that translate instead re-tokenise every draft through text"
            ]


def vocab_kind(tj: Mapping[str, Any]) -> str | None:
    """llama.cpp's vocab type as its converter would write it: SentencePiece-style BPE
    (byte fallback) is SPM, byte-level BPE is BPE, Unigram UGM, WordPiece WPM."""
    raw = tj.get("model")
    model: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    kind = model.get("type")
    if kind == "BPE":
        return "SPM" if model.get("byte_fallback") else "BPE"
    return {"Unigram": "UGM", "WordPiece": "WPM"}.get(str(kind), str(kind) if kind else None)


def _adds(tok: Any) -> tuple[bool, bool]:
    """Whether the tokenizer puts BOS in front / EOS behind what it encodes (llama.cpp's
    add_bos / add_eos), read from what it does to one character."""
    try:
        ids = list(tok("a")["input_ids"])
    except Exception:
        return False, False
    bos, eos = getattr(tok, "bos_token_id", None), getattr(tok, "eos_token_id", None)
    return bool(ids and bos is not None and ids[0] == bos), bool(ids and eos is not None and ids[-1] == eos)


def vocab_problems(tt: Any, dt: Any, vt: int, vd: int, tj: Mapping[str, Any], dj: Mapping[str, Any]) -> list[str]:
    """What llama.cpp's `common_speculative_are_compatible` refuses in this pair, one line
    per failed check (empty: compatible): the vocab type, BOS (when it is added), EOS
    (when it is added), a size difference over 128 and the text of each token id from 5
    up to the smaller vocabulary."""
    out: list[str] = []
    kt, kd = vocab_kind(tj), vocab_kind(dj)
    if kt != kd:
        out.append(f"vocab type: target {kt}, drafter {kd}")
    (bos_t, eos_t), (bos_d, eos_d) = _adds(tt), _adds(dt)
    if bos_t != bos_d or (bos_t and tt.bos_token_id != dt.bos_token_id):
        out.append(f"BOS: target adds {bos_t} (id {tt.bos_token_id}), drafter adds {bos_d} (id {dt.bos_token_id})")
    if eos_t != eos_d or (eos_t and tt.eos_token_id != dt.eos_token_id):
        out.append(f"EOS: target adds {eos_t} (id {tt.eos_token_id}), drafter adds {eos_d} (id {dt.eos_token_id})")
    if abs(vt - vd) > VOCAB_MAX_SIZE_DIFFERENCE:
        out.append(f"vocab sizes {vt} and {vd} differ by {abs(vt - vd)} > {VOCAB_MAX_SIZE_DIFFERENCE} (SPEC_VOCAB_MAX_SIZE_DIFFERENCE)")
    else:
        # ids past a tokenizer's own tokens are the converter's [PAD{id}] rows
        it = {i: t for t, i in tt.get_vocab().items()}
        idr = {i: t for t, i in dt.get_vocab().items()}
        for i in range(VOCAB_CHECK_START_TOKEN_ID, min(vt, vd)):
            a, b = it.get(i, f"[PAD{i}]"), idr.get(i, f"[PAD{i}]")
            if a != b:
                out.append(f"token {i}: target {a!r}, drafter {b!r} (the text of every id from {VOCAB_CHECK_START_TOKEN_ID} must agree)")
                break
    return out


ENGINE = LlamaCpp()
