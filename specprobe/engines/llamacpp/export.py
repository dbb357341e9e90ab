"""llama-server's arguments, as it reads them (common/arg.cpp, common/speculative.cpp,
tools/server/server-context.cpp).

-m, -md, --spec-type (always: without it the server starts no speculative context for a
plain -md), --spec-draft-n-max, --spec-draft-n-min, --spec-draft-p-min (stop drafting
below this drafter probability: the adaptive-K threshold); --temp/--top-k/--top-p/--min-p,
the result's sampling (the server's own defaults are T 0.8, top-k 40, top-p 0.95, min-p
0.05). `--spec-synth-rates P0,P1,…`: unconditional per-position rates, exactly n-max of
them, finite, in [0, 1], non-increasing; the server accepts draft i with P_i / P_(i−1)
(benchmarking only: the output is not the target's). Its n-gram types (--spec-type
ngram-*, with --spec-ngram-*), alone or tried before a draft model. Written as an args
file: one flag and its value a line (`llama-server $(grep -v '^#' FILE)`).

llama-server opens GGUF files only (-m, -md): a built-in target or drafter is written as
the GGUF it stands for, a .gguf as named, and a Hugging Face folder (or repo id) as the
GGUF that llama.cpp's converter makes of it — `python convert_hf_to_gguf.py DIR --outfile
DIR-f16.gguf --outtype f16` — with that command in the file's comments and on stderr as
what must run first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specprobe.core.errors import InputError
from specprobe.engines.base import GREEDY
from specprobe.engines.export import (
    BUILTIN,
    GGUF,
    REPO,
    Plan,
    Writer,
    builtin_gguf,
    comments,
    drafter_elsewhere,
    fmt,
    model_form,
    shell_word,
)
from specprobe.engines.llamacpp import ENGINE


class LlamaCppWriter(Writer):
    methods = {"independent": "draft-simple", "eagle3": "draft-eagle3", "mtp": "draft-mtp", "ngram": "ngram"}
    synthetic = "--spec-synth-rates"
    sampled_drafts_note = "the result follows sampled drafts; llama-server drafts greedily (its drafter's top token)"

    def ngram(self, p: Plan, spec: str, synthetic: bool) -> None:
        """--spec-type ngram-* with --spec-ngram-*; n-gram types beside a draft model."""
        # deferred: numpy comes with the n-gram drafters, and only an n-gram export needs them
        from specprobe.drafters.ngram import SGLANG as SGLANG_NGRAM
        from specprobe.drafters.ngram import SUFFIX, VLLM_NGRAM, parse_spec
        from specprobe.drafters.ngram_mix import check_mixed, is_mixed_spec

        if is_mixed_spec(spec):  # n-gram types beside a draft model: -md and draft-simple after them
            ngram, model = check_mixed(spec)
            p.drafter = model
            p.method = ",".join([*(t.name for t in ngram.types), "draft-simple"])
            p.ngram = {**{f"--spec-{t.name}-{key.replace('_', '-')}": v for t in ngram.types for key, v in t.knobs}, "--spec-draft-n-max": p.k, "--spec-draft-n-min": 0}
            p.notes.append(f"llama-server tries {p.method} in that order: the draft model drafts (at most K = {p.k}) only when no n-gram type did")
            return
        types = parse_spec(spec)
        if types[0].name == SGLANG_NGRAM:
            raise drafter_elsewhere(self.label, spec, "it is SGLang's NGRAM", "sglang")
        if types[0].name == SUFFIX:
            raise drafter_elsewhere(self.label, spec, "it is vLLM's suffix decoding", "vllm")
        if types[0].name == VLLM_NGRAM:
            raise drafter_elsewhere(self.label, spec, "it is vLLM's n-gram drafter", "vllm")
        if synthetic:
            raise InputError("--synthetic: llama-server's synthetic acceptance needs a draft model's draft, not an n-gram type", "export a model drafter's result, or use --engine vllm")
        p.method = ",".join(t.name for t in types)
        p.ngram = {f"--spec-{t.name}-{key.replace('_', '-')}": v for t in types for key, v in t.knobs}
        p.notes.append(f"llama-server drafts as {p.method}: the draft length is the type's own knob (size_m / n_max), not --spec-draft-n-max")

    def adaptive(self, p: Plan, ad: Any, deepest_k: int, k_given: bool) -> None:
        """--spec-draft-p-min: the adaptive threshold, for greedy drafts."""
        knob = self.engine.adaptive_knob
        if not ad.beats_fixed:
            p.notes.append(f"no {knob}: adaptive K ({fmt(ad.speedup)}×) does not beat the fixed K")
        elif p.drafting == GREEDY:
            p.p_min = float(ad.threshold)
            if not k_given:  # the threshold's estimate drafts up to the table's deepest K
                p.k = deepest_k
            p.notes.append(f"adaptive K beats the best fixed K: stop drafting below drafter confidence {fmt(ad.threshold)} ({knob}) → mean K {fmt(ad.mean_k)}, τ {fmt(ad.tau_tokens)}, speedup {fmt(ad.speedup)}×, drafting at most {p.k}")
        else:
            p.notes.append(f"adaptive K (confidence {fmt(ad.threshold)}: speedup {fmt(ad.speedup)}×) beats the fixed K, but {self.label} has no greedy confidence threshold to set: fixed K written")

    def locate(self, p: Plan) -> None:
        """-m and -md as GGUF files llama-server opens (see the module's docstring)."""
        if p.target:
            p.target = self._gguf(p, p.target, "target")
        if p.drafter:
            p.drafter = self._gguf(p, p.drafter, "EAGLE-3 head" if p.kind == "eagle3" else "draft model")

    def _gguf(self, p: Plan, spec: str, role: str) -> str:
        form = model_form(spec)
        if form == BUILTIN:
            return str(builtin_gguf(spec))
        if form == GGUF:
            return spec
        gguf, steps = convert_to_gguf(spec, form == REPO)
        p.prepare += steps
        extra = (
            "; an EAGLE-3 head converts only with a converter that knows its architecture: llama-server's draft-eagle3 takes a GGUF that carries the head's extract_layers"
            if p.kind == "eagle3" and role != "target"
            else ""
        )
        p.notes.append(f"run first: the {role} {spec} is a Hugging Face checkpoint and llama-server opens GGUF files only: " + " && ".join(steps) + f" (llama.cpp's converter, from the release of the llama-server you run{extra})")
        return gguf

    def write(self, p: Plan, output: Path | None) -> str:
        return write_llamacpp(p)


def convert_to_gguf(spec: str, repo: bool) -> tuple[str, list[str]]:
    """The GGUF llama.cpp's converter makes of a Hugging Face folder (or, `repo`, of a repo
    id, downloaded into a folder of its name first), and the commands that make it."""
    steps: list[str] = []
    folder = spec.rstrip("/") or spec
    if repo:
        folder = spec.rsplit("/", 1)[-1]
        steps.append(f"hf download {shell_word(spec)} --local-dir {shell_word(folder)}")
    gguf = f"{folder}-f16.gguf"
    steps.append(f"python convert_hf_to_gguf.py {shell_word(folder)} --outfile {shell_word(gguf)} --outtype f16")
    return gguf, steps


def llama_args(p: Plan) -> list[str]:
    """llama-server's arguments, as words."""
    words: list[str] = []
    if p.target:
        words += ["-m", p.target]
    if p.drafter:
        words += ["-md", p.drafter]
    # always named: llama-server (0.3.36's build) infers no draft type from a plain -md
    # and, without one, starts no speculative context
    words += ["--spec-type", p.method]
    if p.sampling:  # llama-server's own defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05) differ
        words += ["--temp", f"{p.sampling['temperature']:g}", "--top-k", str(int(p.sampling["top_k"])), "--top-p", f"{p.sampling['top_p']:g}", "--min-p", f"{p.sampling['min_p']:g}"]
    if p.kind == "ngram":
        for flag, v in p.ngram.items():
            words += [flag, str(v)]
        return words
    words += ["--spec-draft-n-max", str(p.k), "--spec-draft-n-min", "0"]
    if p.p_min is not None:
        words += ["--spec-draft-p-min", f"{p.p_min:g}"]
    if p.rates is not None:
        words += ["--spec-synth-rates", ",".join(f"{r:.6g}" for r in p.rates)]
    return words


def write_llamacpp(p: Plan) -> str:
    """An args file: one flag and its value a line (`llama-server $(grep -v '^#' FILE)`)."""
    words = llama_args(p)
    lines = comments(p.notes)
    i = 0
    while i < len(words):
        if i + 1 < len(words) and not words[i + 1].startswith("-"):
            lines.append(f"{words[i]} {shell_word(words[i + 1])}")
            i += 2
        else:
            lines.append(words[i])
            i += 1
    return "\n".join(lines) + "\n"


WRITER = LlamaCppWriter(ENGINE)
