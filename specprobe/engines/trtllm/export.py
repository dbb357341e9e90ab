"""TensorRT-LLM's serving config, as its LLM API reads it (tensorrt_llm/llmapi/llm_args.py,
DecodingBaseConfig).

`speculative_config:` {decoding_type, max_draft_len, speculative_model}; draft_len_schedule
{batch size: draft length}: each key the largest batch size its length serves, batch
sizes above the largest key do not speculate, the smallest key's length must equal
max_draft_len and none exceed it; acceptance_window (≥ 0, requests) and
acceptance_length_threshold (≥ 0): speculation is switched off for good once the mean
acceptance length over the last acceptance_window finished requests falls below it. Draft
trees: static rank paths (eagle_choices, medusa_choices) or EAGLE-2's dynamic tree. Its
NGram is another algorithm than the n-gram drafters specprobe reimplements: not written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from specprobe.core.errors import SpecprobeError
from specprobe.engines.export import Plan, Writer, comments, fmt, locate_folders, yaml_scalar
from specprobe.engines.trtllm import ENGINE
from specprobe.judge.rules import load_table
from specprobe.result import Result


class TensorRTLLMWriter(Writer):
    methods = {"independent": "DraftTarget", "eagle": "Eagle", "eagle3": "Eagle3", "medusa": "Medusa", "mtp": "MTP"}
    schedule = True

    def stop_floor(self, p: Plan, result: Result, k: int, tau: float | None, speedup: float | None) -> None:
        """Switch speculation off when the acceptance length falls below break-even (a
        round's cost in target steps) or below the rules' acceptance floor at this K."""
        if tau is None or not speedup:
            return
        even = tau / speedup
        floor_rule = acceptance_floor(result)
        why = f"a round at K {k} costs {even:.3g} target steps (τ {fmt(tau)} ÷ speedup {fmt(speedup)}): a mean acceptance length below it is slower than no speculation"
        p.floor = round(even, 3)
        if floor_rule is not None:
            rid, a_floor = floor_rule
            tau_floor = sum(a_floor**j for j in range(k + 1))  # τ(K) of a drafter at the floor, i.i.d.
            why += f"; the rules' acceptance floor ({rid}: α < {a_floor:g}) is τ({k}) = {tau_floor:.3g}"
            p.floor = round(max(even, tau_floor), 3)
        p.window = result.prompt_set.num_prompts if result.prompt_set is not None else None
        p.notes.append(f"acceptance_length_threshold {p.floor:g}, the larger: {why}; window {p.window or '—'} requests (the prompts the result scored)")

    def locate(self, p: Plan) -> None:
        """A built-in or GGUF target or draft model as the checkpoint folder it opens."""
        p.notes += locate_folders(p, self.label)

    def write(self, p: Plan, output: Path | None) -> str:
        return write_trtllm(p)


def acceptance_floor(result: Result) -> tuple[str, float] | None:
    """(rule id, α) of the rules table's acceptance floor: the highest bound `accept_prob_mean
    < X` of an error-severity acceptance rule (the default table: SP202, α < 0.30, 'far
    below a useful drafter'), from the rule files the result was judged with where they are
    still there, else the default table."""
    try:
        table = load_table([Path(p) for p in result.config.rules])
    except SpecprobeError:
        table = load_table()
    best: tuple[str, float] | None = None
    for rule in table.rules:
        if rule.family != "acceptance" or rule.severity != "error":
            continue
        for m in re.finditer(r"accept_prob_mean\s*<\s*([0-9]*\.?[0-9]+)", rule.when):
            x = float(m.group(1))
            if best is None or x > best[1]:
                best = (rule.id, x)
    return best


def trtllm_schedule(p: Plan) -> tuple[int, dict[int, int] | None]:
    """(max_draft_len, draft_len_schedule) from the vLLM-shaped ranges: each range's end
    is its key; the first length is max_draft_len and bounds the others; a last range
    that does not speculate is left to the implicit 0 above the largest key."""
    if not p.schedule or p.schedule[0][2] == 0:
        return p.k, None
    first = p.schedule[0][2]
    out = {hi: min(kk, first) for _, hi, kk in p.schedule}
    while len(out) > 1 and out[max(out)] == 0:
        del out[max(out)]
    return first, out


def write_trtllm(p: Plan) -> str:
    max_len, sched = trtllm_schedule(p)
    spec: dict[str, Any] = {"decoding_type": p.method}
    if p.kind == "mtp":
        spec["num_nextn_predict_layers"] = max_len
    if p.kind == "medusa":
        spec["num_medusa_heads"] = max_len
    spec["max_draft_len"] = max_len
    if p.tree is not None:  # TensorRT-LLM's trees: static rank paths, or EAGLE-2's dynamic tree
        t = p.tree
        spec["max_draft_len"] = t["steps"]
        if t["paths"]:
            spec["medusa_choices" if p.kind == "medusa" else "eagle_choices"] = t["paths"]
        else:
            spec["use_dynamic_tree"] = True
            spec["dynamic_tree_max_topK"] = t["topk"]
        spec["max_total_draft_tokens"] = t["tokens"] - 1
    if p.drafter:
        spec["speculative_model"] = p.drafter
    if sched:
        spec["draft_len_schedule"] = sched
    if p.floor is not None:
        spec["acceptance_window"] = p.window or 0
        spec["acceptance_length_threshold"] = p.floor
    lines = comments(p.notes)
    if sched:
        lines.append(f"# above batch {max(sched)} (the largest batch size timed) TensorRT-LLM does not speculate")
    if p.target:
        lines.append(f"model: {yaml_scalar(p.target)}")
    lines.append("speculative_config:")
    lines += [f"  {key}: {yaml_scalar(v)}" for key, v in spec.items()]
    return "\n".join(lines) + "\n"


WRITER = TensorRTLLMWriter(ENGINE)
