"""SGLang's serving config, as its server arguments read it (python/sglang/srt/server_args.py).

A launch `--config` YAML: speculative-algorithm (EAGLE | EAGLE3 | STANDALONE | NEXTN |
NGRAM), speculative-num-steps (the chain depth K), speculative-eagle-topk 1 (a chain),
speculative-num-draft-tokens K + 1 (the tree's tokens, the root included); a dynamic draft
tree as its steps, topk and num-draft-tokens. Its NGRAM only for a result of its own
drafter (sglang-ngram): the tree's size and its speculative-ngram-* knobs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specprobe.core.errors import InputError
from specprobe.engines.base import PROBABILISTIC
from specprobe.engines.export import (
    Plan,
    Writer,
    comments,
    locate_folders,
    mixed_elsewhere,
    yaml_scalar,
)
from specprobe.engines.sglang import ENGINE


class SGLangWriter(Writer):
    methods = {"independent": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "ngram": "NGRAM"}

    def ngram(self, p: Plan, spec: str, synthetic: bool) -> None:
        """Its NGRAM: the tree's size (speculative-num-draft-tokens) and speculative-ngram-*."""
        # deferred: numpy comes with the n-gram drafters, and only an n-gram export needs them
        from specprobe.drafters.ngram import SGLANG as SGLANG_NGRAM
        from specprobe.drafters.ngram import parse_spec
        from specprobe.drafters.ngram_mix import is_mixed_spec

        if is_mixed_spec(spec):
            raise mixed_elsewhere(self.label, spec)
        types = parse_spec(spec)
        if types[0].name != SGLANG_NGRAM:
            raise InputError(f"{self.label} does not run {spec!r}: its NGRAM is another n-gram algorithm (sglang-ngram)", f"export it for the engine whose drafter it is, or diagnose sglang-ngram to export for {self.label}")
        knobs = dict(types[0].knobs)
        p.ngram = {"speculative-num-draft-tokens": knobs.pop("num_draft_tokens"), **{f"speculative-ngram-{key.replace('_', '-')}": v for key, v in knobs.items()}}

    def check_tree(self, tree: Mapping[str, Any]) -> None:
        if tree["paths"]:
            raise InputError("SGLang builds its draft trees dynamically (steps, topk, num-draft-tokens); a static tree of rank paths is not one of its knobs", "export it for --engine trtllm (eagle_choices), or pick a steps=S,topk=T,tokens=N tree")

    def locate(self, p: Plan) -> None:
        """A built-in or GGUF target or draft model as the checkpoint folder it opens."""
        p.notes += locate_folders(p, self.label)
        if p.dtype is not None and p.target:
            p.notes.append(f"dtype {p.dtype}: the precision the result scored the target at (SGLang's --dtype auto serves a float32 checkpoint in half precision, which moves acceptance)")

    def write(self, p: Plan, output: Path | None) -> str:
        return write_sglang(p)


def write_sglang(p: Plan) -> str:
    lines = comments(p.notes)
    if p.target:
        lines.append(f"model-path: {yaml_scalar(p.target)}")
        if p.dtype:  # the precision the result scored at
            lines.append(f"dtype: {yaml_scalar(p.dtype)}")
    lines.append(f"speculative-algorithm: {p.method}")
    if p.kind == "ngram":  # NGRAM: the tree's size and the cache's knobs, as the result measured them
        lines += [f"{key}: {yaml_scalar(v)}" for key, v in p.ngram.items()]
        if p.sampling:
            prefs = {**p.sampling, "top_k": int(p.sampling["top_k"]) or -1}
            lines.append(f"preferred-sampling-params: {yaml_scalar(json.dumps(prefs))}")
        return "\n".join(lines) + "\n"
    if p.drafter:
        lines.append(f"speculative-draft-model-path: {yaml_scalar(p.drafter)}")
    topk, tokens = (p.tree["topk"], p.tree["tokens"]) if p.tree is not None else (1, p.k + 1)
    lines.append(f"speculative-num-steps: {p.k}")
    lines.append(f"speculative-eagle-topk: {topk}")
    lines.append(f"speculative-num-draft-tokens: {tokens}")
    if p.drafting == PROBABILISTIC:
        lines.append("speculative-use-rejection-sampling: true")
    if p.sampling:  # a JSON string, as --preferred-sampling-params takes it (top_k -1: off)
        prefs = {**p.sampling, "top_k": int(p.sampling["top_k"]) or -1}
        lines.append(f"preferred-sampling-params: {yaml_scalar(json.dumps(prefs))}")
    return "\n".join(lines) + "\n"


WRITER = SGLangWriter(ENGINE)
