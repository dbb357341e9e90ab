"""A result's recommendation as the configuration each engine takes, field by field as
the engines' own config code reads it:

vLLM (vllm/config/speculative.py, vllm/v1/spec_decode/dynamic/utils.py)
  `--speculative-config` JSON: method (draft_model | eagle | eagle3 | medusa | mtp |
  ngram), model, num_speculative_tokens (> 0), draft_sample_method (greedy |
  probabilistic); num_speculative_tokens_per_batch_size: [[start, end, k], …] with
  inclusive batch-size ranges, the first starting at 1, sorted and not overlapping,
  k ≥ 0 and clamped to num_speculative_tokens; past the last range its k holds. The
  synthetic form: rejection_sample_method "synthetic" with synthetic_acceptance_rates,
  entry i the probability that the first i + 1 drafts are all accepted (unconditional),
  length num_speculative_tokens, each in [0, 1], non-increasing.
SGLang (python/sglang/srt/server_args.py)
  a launch `--config` YAML: speculative-algorithm (EAGLE | EAGLE3 | STANDALONE | NEXTN |
  NGRAM), speculative-num-steps (the chain depth K), speculative-eagle-topk 1 (a chain),
  speculative-num-draft-tokens K + 1 (the tree's tokens, the root included).
llama.cpp (common/arg.cpp, common/speculative.cpp, tools/server/server-context.cpp)
  llama-server arguments: -m, -md, --spec-type (always: without it the server starts no
  speculative context for a plain -md), --spec-draft-n-max, --spec-draft-n-min,
  --spec-draft-p-min (stop drafting below this drafter probability: the adaptive-K
  threshold); --temp/--top-k/--top-p/--min-p, the result's sampling (the server's own
  defaults are T 0.8, top-k 40, top-p 0.95, min-p 0.05). `--spec-synth-rates P0,P1,…`: unconditional per-position rates, exactly
  n-max of them, finite, in [0, 1], non-increasing; the server accepts draft i with
  P_i / P_(i−1) (benchmarking only: the output is not the target's).
TensorRT-LLM (tensorrt_llm/llmapi/llm_args.py, DecodingBaseConfig)
  `speculative_config:` {decoding_type, max_draft_len, speculative_model};
  draft_len_schedule {batch size: draft length}: each key the largest batch size its
  length serves, batch sizes above the largest key do not speculate, the smallest key's
  length must equal max_draft_len and none exceed it; acceptance_window (≥ 0, requests)
  and acceptance_length_threshold (≥ 0): speculation is switched off for good once the
  mean acceptance length over the last acceptance_window finished requests falls below it.

Every export names the numbers it rests on (in comments where the format has them, and
in `Export.note`), its first line the prediction it comes from (`Plan.prediction`).
`slower_than_plain` says when that prediction is below 1×: the CLI refuses it unless
--force."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specprobe.core.errors import InputError
from specprobe.engines import GREEDY, PROBABILISTIC, get
from specprobe.result import Result

VLLM, SGLANG, LLAMA_CPP, TRTLLM = "vllm", "sglang", "llama.cpp", "trtllm"
EXPORT_ENGINES = (VLLM, SGLANG, LLAMA_CPP, TRTLLM)

# specprobe's drafter kinds → each engine's method name (absent: the engine has none)
METHODS: dict[str, dict[str, str]] = {
    VLLM: {"independent": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa", "mtp": "mtp", "ngram": "ngram"},
    # SGLang's NGRAM only for a result of its own drafter (sglang-ngram); TensorRT-LLM's
    # NGram is another algorithm than the n-gram drafters specprobe reimplements
    SGLANG: {"independent": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "ngram": "NGRAM"},
    LLAMA_CPP: {"independent": "draft-simple", "eagle3": "draft-eagle3", "mtp": "draft-mtp", "ngram": "ngram"},
    TRTLLM: {"independent": "DraftTarget", "eagle": "Eagle", "eagle3": "Eagle3", "medusa": "Medusa", "mtp": "MTP"},
}
_SPEC_PREFIXES = ("eagle3:", "eagle:", "medusa:", "mtp:")


@dataclass
class Plan:
    """What an export says, before it is written in any engine's words."""

    engine: str
    source: Path
    kind: str
    method: str
    target: str | None
    drafter: str | None  # the draft model / head path (None: the target's own MTP layers, n-gram)
    k: int  # the K the config runs (num_speculative_tokens, n-max, max_draft_len)
    drafting: str
    # [(start, end, k)] inclusive batch-size ranges (vLLM's shape), None: one K for all
    schedule: list[tuple[int, int, int]] | None = None
    p_min: float | None = None  # llama.cpp's adaptive threshold
    floor: float | None = None  # TensorRT-LLM acceptance_length_threshold (tokens per verify step)
    window: int | None = None  # TensorRT-LLM acceptance_window (requests)
    rates: list[float] | None = None  # synthetic: P(first i drafts all accepted), i = 1..K
    tree: dict[str, Any] | None = None  # a draft tree (steps, topk, tokens, paths) instead of a chain of K
    ngram: dict[str, int | float] = field(default_factory=dict)  # an n-gram drafter's knobs, as the engine spells them
    sampling: dict[str, float] = field(default_factory=dict)  # the target's sampling the result measured
    notes: list[str] = field(default_factory=list)
    speedup_at: str = ""  # what that speedup is for: "K = 3", "its draft tree"
    speedup: float | None = None  # the result's predicted speedup for what is written (its K, or its tree)
    prediction: str = ""  # the prediction the config comes from, one line (written first among its comments)

    @property
    def tau_synthetic(self) -> float | None:
        """Tokens per verify step the synthetic rates give: 1 + Σ rates."""
        return None if self.rates is None else 1.0 + sum(self.rates)


@dataclass(frozen=True)
class Export:
    text: str
    note: list[str]
    plan: Plan


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _drafter_path(result: Result) -> str | None:
    spec = result.drafter.spec or result.config.drafter or ""
    if spec in ("mtp",):
        return None
    for prefix in _SPEC_PREFIXES:
        if spec.startswith(prefix):
            return spec[len(prefix) :] or None
    return spec or None


def _kind(result: Result) -> str:
    kind = result.drafter.kind or ""
    spec = result.drafter.spec or ""
    if not kind or kind == "head":
        kind = next((p[:-1] for p in _SPEC_PREFIXES if spec.startswith(p)), kind)
        if spec == "mtp":
            kind = "mtp"
    return kind


def _k_row(result: Result, k: int) -> Any:
    return next((r for r in result.k_table if r.k == k), None)


def _tau(row: Any) -> float | None:
    if row is None:
        return None
    return row.tau_renewal_tokens if row.tau_renewal_tokens is not None else row.tau_tokens


def schedule_from_costs(result: Result) -> list[tuple[int, int, int]] | None:
    """Each timed batch size's best K (0 where no K paid), as inclusive batch-size ranges:
    a timed size serves up to the geometric mean of it and the next timed size; adjacent
    ranges with the same K are merged. None unless at least two batch sizes were timed."""
    if result.cost is None:
        return None
    timed = sorted((b for b in result.cost.batches if b.best_k is not None and not b.skipped and b.rows), key=lambda b: b.batch_size)
    if len(timed) < 2:
        return None
    out: list[tuple[int, int, int]] = []
    lo = 1
    for i, b in enumerate(timed):
        k = int(b.best_k or 0) if (b.speedup_best or 0.0) > 1.0 else 0
        hi = math.isqrt(b.batch_size * timed[i + 1].batch_size) if i + 1 < len(timed) else b.batch_size
        hi = max(hi, lo)
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], hi, k)
        else:
            out.append((lo, hi, k))
        lo = hi + 1
    return out


def acceptance_floor(result: Result) -> tuple[str, float] | None:
    """(rule id, α) of the rules table's acceptance floor: the highest bound `accept_prob_mean
    < X` of an error-severity acceptance rule (the default table: SP202, α < 0.30, 'far
    below a useful drafter'), from the rule files the result was judged with where they are
    still there, else the default table."""
    import re

    from specprobe.core.errors import SpecprobeError
    from specprobe.judge.rules import load_table

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


def synthetic_rates(result: Result, k: int) -> list[float]:
    """r_1..r_K from the result's depth curve: the probability that the first i drafts are
    all accepted, clamped to [0, 1] and made non-increasing (a running minimum; the curve
    is one by construction, the clamp only guards rounding)."""
    depth = result.depth
    cum = list(depth.cumulative) if depth is not None else []
    if len(cum) < k or any(c is None for c in cum[:k]):
        have = len(cum)
        raise InputError(
            f"the result's depth curve has {have} depth{'s' if have != 1 else ''}; --synthetic at K = {k} needs {k}",
            "pass --k at most the depths it measured, or re-run diagnose with a larger --k-max",
        )
    rates: list[float] = []
    prev = 1.0
    for c in cum[:k]:
        r = min(prev, max(0.0, min(1.0, float(c or 0.0))))  # None refused above
        rates.append(r)
        prev = r
    return rates


def plan(result: Result, source: Path, engine: str, k: int | None = None, synthetic: bool = False) -> Plan:
    """What to export, checked against what the engine takes (InputError, one line, when
    the result cannot be written for it)."""
    label = get(engine).label
    if not result.scored or not result.k_table:
        raise InputError(f"{source.name} has no τ(K) table ({result.command}{', stopped: ' + result.stopped if result.stopped else ''})", "export a result of 'specprobe diagnose' or 'simulate' that scored its prompts")
    kind = _kind(result)
    method = METHODS[engine].get(kind)
    if method is None:
        what = {"layer_skip": f"a layer-skip self-draft ({result.drafter.spec})"}.get(kind, f"a {kind or 'unknown'} drafter ({result.drafter.spec})")
        engines = [get(e).label for e in EXPORT_ENGINES if kind in METHODS[e]]
        hint = f"export it for {', '.join(engines)}" if engines else "the engines serve a layer-skip self-draft only as its own checkpoint: save the target's first layers as a model and diagnose that drafter"
        raise InputError(f"{label} has no method for {what}", hint)
    if synthetic and engine not in (VLLM, LLAMA_CPP):
        raise InputError(f"--synthetic: {label} has no synthetic-acceptance mode that takes per-position rates", "use --engine vllm (rejection_sample_method synthetic) or --engine llama.cpp (--spec-synth-rates)")
    best = result.best_k
    chosen = k if k is not None else best
    if chosen is None:
        raise InputError(f"{source.name} recommends no K (no cost could be judged)", "pass --k")
    ks = [r.k for r in result.k_table]
    if chosen not in ks:
        raise InputError(f"--k {chosen} is not in the result's τ(K) table (K {min(ks)}–{max(ks)})", "pass a K the result measured, or re-run diagnose with a larger --k-max")
    drafting = result.procedure.drafting if result.procedure is not None else GREEDY
    p = Plan(engine=engine, source=source, kind=kind, method=method, target=result.target.spec or result.config.target, drafter=_drafter_path(result) if kind != "ngram" else None, k=chosen, drafting=drafting)
    if kind == "ngram":
        _ngram(p, result.drafter.spec or "", label, synthetic)
    if result.sampling is not None:  # served as the result measured it (each engine's own defaults differ)
        t = result.sampling.target
        p.sampling = {"temperature": float(t.temperature), "top_k": int(t.top_k), "top_p": float(t.top_p), "min_p": float(t.min_p)}
    followed = result.procedure.engine if result.procedure is not None else None
    if followed and followed != engine:
        p.notes.append(f"the result's numbers follow {get(followed).label}'s draft-and-verify procedure, not {label}'s: 'specprobe diagnose … --engine {engine}' gives {label}'s")
    row = _k_row(result, chosen)
    tau, speedup = _tau(row), row.speedup if row is not None else None
    alpha = result.metric("accept_prob_engine_mean") or result.metric("accept_prob_mean")
    batch = result.cost.batch_size if result.cost is not None else result.config.batch_size
    cost_ratio = result.cost.cost_ratio if result.cost is not None else None
    why = "the result's best K" if k is None else f"--k {k}" + (f" (the result's best K is {best})" if best is not None and best != k else "")
    p.notes.append(f"from {source.name} ({result.command}, {result.created}): drafter {result.drafter.spec} → target {result.target.spec}, {result.procedure.description if result.procedure else drafting + ' drafts'}")
    p.notes.append(f"K = {chosen}: {why}; τ({chosen}) = {_f(tau)} tokens per verify step, speedup {_f(speedup)}× at batch {batch} (drafter/target cost c = {_f(cost_ratio)}), α = {_f(alpha)} per token")
    p.speedup, p.speedup_at = speedup, f"K = {chosen}"
    p.prediction = f"prediction: speedup {_f(speedup)}× at K = {chosen}, α = {_f(alpha)} per token, τ = {_f(tau)} tokens per verify step, from {source.resolve()}"

    # per-batch-size schedule (vLLM, TensorRT-LLM): only for the result's own recommendation
    if engine in (VLLM, TRTLLM) and k is None and not synthetic:
        sched = schedule_from_costs(result)
        if sched is not None:
            p.schedule = sched
            p.k = max(chosen, max(kk for _, _, kk in sched))
            p.notes.append("batch-size schedule (each timed batch size's best K; K 0 where no K paid): " + ", ".join(f"batch {lo}–{hi} K {kk}" for lo, hi, kk in sched))
    elif engine in (VLLM, TRTLLM) and k is not None and schedule_from_costs(result) is not None:
        p.notes.append("no batch-size schedule: --k fixes one K for every batch size")

    # the adaptive threshold, in the engine's own knob
    ad = result.adaptive
    if ad is not None and ad.beats_fixed and ad.threshold is not None and not synthetic:
        knob = get(engine).adaptive_knob
        if engine == LLAMA_CPP and drafting == GREEDY:
            p.p_min = float(ad.threshold)
            if k is None:  # the threshold's estimate drafts up to the table's deepest K
                p.k = max(ks)
            p.notes.append(f"adaptive K beats the best fixed K: stop drafting below drafter confidence {_f(ad.threshold)} ({knob}) → mean K {_f(ad.mean_k)}, τ {_f(ad.tau_tokens)}, speedup {_f(ad.speedup)}×, drafting at most {p.k}")
        else:
            p.notes.append(f"adaptive K (confidence {_f(ad.threshold)}: speedup {_f(ad.speedup)}×) beats the fixed K, but {label} has no {'greedy ' if engine == LLAMA_CPP else ''}confidence threshold to set: fixed K written")
    elif ad is not None and ad.beats_fixed is False and engine == LLAMA_CPP and not synthetic:
        p.notes.append(f"no --spec-draft-p-min: adaptive K ({_f(ad.speedup)}×) does not beat the fixed K")

    # TensorRT-LLM: switch speculation off when the acceptance length falls below break-even
    # (a round's cost in target steps) or below the rules' acceptance floor at this K
    if engine == TRTLLM and tau is not None and speedup:
        even = tau / speedup
        floor_rule = acceptance_floor(result)
        why = f"a round at K {chosen} costs {even:.3g} target steps (τ {_f(tau)} ÷ speedup {_f(speedup)}): a mean acceptance length below it is slower than no speculation"
        p.floor = round(even, 3)
        if floor_rule is not None:
            rid, a_floor = floor_rule
            tau_floor = sum(a_floor**j for j in range(chosen + 1))  # τ(K) of a drafter at the floor, i.i.d.
            why += f"; the rules' acceptance floor ({rid}: α < {a_floor:g}) is τ({chosen}) = {tau_floor:.3g}"
            p.floor = round(max(even, tau_floor), 3)
        p.window = result.prompt_set.num_prompts if result.prompt_set is not None else None
        p.notes.append(f"acceptance_length_threshold {p.floor:g}, the larger: {why}; window {p.window or '—'} requests (the prompts the result scored)")

    if synthetic:
        p.rates = synthetic_rates(result, chosen)
        p.notes.append(f"synthetic acceptance: rates r_i = P(the first i drafts all accepted) from the result's depth curve ({result.depth.source if result.depth else '?'}), i = 1..{chosen}; tokens per verify step 1 + Σ r_i = {p.tau_synthetic:.4g}")
    if drafting == PROBABILISTIC and engine == LLAMA_CPP:
        p.notes.append("the result follows sampled drafts; llama-server drafts greedily (its drafter's top token)")
    return p


def _ngram(p: Plan, spec: str, label: str, synthetic: bool) -> None:
    """An n-gram drafter's knobs in the engine's words: vLLM's prompt lookup
    (prompt_lookup_min/max) and suffix decoding (suffix_decoding_*), llama-server's
    --spec-type ngram-* with --spec-ngram-*."""
    from specprobe.drafters.ngram import SGLANG as SGLANG_NGRAM
    from specprobe.drafters.ngram import SUFFIX, VLLM_NGRAM, parse_spec
    from specprobe.drafters.ngram_mix import check_mixed, is_mixed_spec

    if is_mixed_spec(spec):  # llama.cpp's n-gram types beside a draft model: -md and draft-simple after them
        if p.engine != LLAMA_CPP:
            raise InputError(f"{label} does not run {spec!r}: only llama.cpp tries n-gram types beside a draft model", "export it with --engine llama.cpp")
        ngram, model = check_mixed(spec)
        p.drafter = model
        p.method = ",".join([*(t.name for t in ngram.types), "draft-simple"])
        p.ngram = {**{f"--spec-{t.name}-{key.replace('_', '-')}": v for t in ngram.types for key, v in t.knobs}, "--spec-draft-n-max": p.k, "--spec-draft-n-min": 0}
        p.notes.append(f"llama-server tries {p.method} in that order: the draft model drafts (at most K = {p.k}) only when no n-gram type did")
        return
    types = parse_spec(spec)
    if (types[0].name == SGLANG_NGRAM) != (p.engine == SGLANG):
        if p.engine == SGLANG:
            raise InputError(f"{label} does not run {spec!r}: its NGRAM is another n-gram algorithm (sglang-ngram)", f"export it for the engine whose drafter it is, or diagnose sglang-ngram to export for {label}")
        raise InputError(f"{label} does not run {spec!r}: it is SGLang's NGRAM", "export it with --engine sglang")
    if types[0].name == SGLANG_NGRAM:  # its tree's size and its speculative-ngram-* knobs
        knobs = dict(types[0].knobs)
        p.ngram = {"speculative-num-draft-tokens": knobs.pop("num_draft_tokens"), **{f"speculative-ngram-{key.replace('_', '-')}": v for key, v in knobs.items()}}
        return
    if types[0].name == SUFFIX:  # vLLM's suffix decoding: method suffix, its suffix_decoding_* knobs
        if p.engine != VLLM:
            raise InputError(f"{label} does not run {spec!r}: it is vLLM's suffix decoding", "export it with --engine vllm")
        p.method = "suffix"
        p.ngram = {f"suffix_decoding_{key}": v for key, v in types[0].knobs if key != "k"}
        return
    vllm_kind = types[0].name == VLLM_NGRAM
    if p.engine == VLLM and not vllm_kind or p.engine == LLAMA_CPP and vllm_kind:
        other = "vLLM" if vllm_kind else "llama.cpp"
        raise InputError(f"{label} does not run {spec!r}: it is {other}'s n-gram drafter", f"export it with --engine {'vllm' if vllm_kind else 'llama.cpp'}")
    if synthetic and p.engine == LLAMA_CPP:
        raise InputError("--synthetic: llama-server's synthetic acceptance needs a draft model's draft, not an n-gram type", "export a model drafter's result, or use --engine vllm")
    if vllm_kind:
        t = types[0]
        p.ngram = {"prompt_lookup_min": t.get("min"), "prompt_lookup_max": t.get("max")}
        return
    p.method = ",".join(t.name for t in types)
    p.ngram = {f"--spec-{t.name}-{key.replace('_', '-')}": v for t in types for key, v in t.knobs}
    p.notes.append(f"llama-server drafts as {p.method}: the draft length is the type's own knob (size_m / n_max), not --spec-draft-n-max")


# ----------------------------------------------------------------------------- the writers
def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{kk}: {_yaml_scalar(vv)}" for kk, vv in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a YAML double-quoted scalar


def _comments(notes: Sequence[str]) -> list[str]:
    return [f"# {n}" for n in ["written by specprobe export", *notes]]


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
    lines = _comments(p.notes)
    if p.target:
        lines.append(f"model: {_yaml_scalar(p.target)}")
    if p.sampling:  # the requests' defaults: the sampling the result measured
        lines.append(f"override-generation-config: {_yaml_scalar(p.sampling)}")
    lines.append("speculative-config:")
    lines += [f"  {key}: {_yaml_scalar(v)}" for key, v in spec.items()]
    return "\n".join(lines) + "\n"


def write_sglang(p: Plan) -> str:
    lines = _comments(p.notes)
    if p.target:
        lines.append(f"model-path: {_yaml_scalar(p.target)}")
    lines.append(f"speculative-algorithm: {p.method}")
    if p.kind == "ngram":  # NGRAM: the tree's size and the cache's knobs, as the result measured them
        lines += [f"{key}: {_yaml_scalar(v)}" for key, v in p.ngram.items()]
        if p.sampling:
            prefs = {**p.sampling, "top_k": int(p.sampling["top_k"]) or -1}
            lines.append(f"preferred-sampling-params: {_yaml_scalar(json.dumps(prefs))}")
        return "\n".join(lines) + "\n"
    if p.drafter:
        lines.append(f"speculative-draft-model-path: {_yaml_scalar(p.drafter)}")
    topk, tokens = (p.tree["topk"], p.tree["tokens"]) if p.tree is not None else (1, p.k + 1)
    lines.append(f"speculative-num-steps: {p.k}")
    lines.append(f"speculative-eagle-topk: {topk}")
    lines.append(f"speculative-num-draft-tokens: {tokens}")
    if p.drafting == PROBABILISTIC:
        lines.append("speculative-use-rejection-sampling: true")
    if p.sampling:  # a JSON string, as --preferred-sampling-params takes it (top_k -1: off)
        prefs = {**p.sampling, "top_k": int(p.sampling["top_k"]) or -1}
        lines.append(f"preferred-sampling-params: {_yaml_scalar(json.dumps(prefs))}")
    return "\n".join(lines) + "\n"


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


def _shell_word(w: str) -> str:
    return w if w and all(c.isalnum() or c in "-_./,:=+@%" for c in w) else "'" + w.replace("'", "'\\''") + "'"


def write_llamacpp(p: Plan) -> str:
    """An args file: one flag and its value a line (`llama-server $(grep -v '^#' FILE)`)."""
    words = llama_args(p)
    lines = _comments(p.notes)
    i = 0
    while i < len(words):
        if i + 1 < len(words) and not words[i + 1].startswith("-"):
            lines.append(f"{words[i]} {_shell_word(words[i + 1])}")
            i += 2
        else:
            lines.append(words[i])
            i += 1
    return "\n".join(lines) + "\n"


def slower_than_plain(ex: Export) -> str | None:
    """The one-line refusal for an export whose predicted speedup is below 1× (SP301's
    rule: speculative decoding would slow this target down), else None. A synthetic
    export is exempt: it is a benchmark of the rates, not a serving config."""
    p = ex.plan
    if p.rates is not None or p.speedup is None or p.speedup >= 1.0:
        return None
    return f"{p.source.name} predicts a speedup of {_f(p.speedup)}× for {p.speedup_at} (SP301 no-speedup: speedup below 1.0, speculative decoding would slow this target down); nothing written — serve without speculation, export a result with a faster drafter, or pass --force to write it anyway"


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
    lines = _comments(p.notes)
    if sched:
        lines.append(f"# above batch {max(sched)} (the largest batch size timed) TensorRT-LLM does not speculate")
    if p.target:
        lines.append(f"model: {_yaml_scalar(p.target)}")
    lines.append("speculative_config:")
    lines += [f"  {key}: {_yaml_scalar(v)}" for key, v in spec.items()]
    return "\n".join(lines) + "\n"


def choose_tree(result: Result, source: Path, engine: str, k: int | None, synthetic: bool, tree: str | None, given: bool) -> dict[str, Any] | None:
    """The draft tree an export writes, or None for a chain: `tree` as asked (it must be
    the result's own tree or in its grid); without it, the result's own tree, else its
    best tree when that beats the best chain — for engines that verify trees only. An
    explicit --k (or --synthetic) asks for a chain."""
    label = get(engine).label
    trees = result.trees
    if tree is not None and given:
        if engine not in (SGLANG, TRTLLM):
            raise InputError(f"--tree: {label} verifies chains, not trees", "export the tree for --engine sglang or trtllm, or leave --tree out")
        if k is not None or synthetic:
            raise InputError(f"--tree and {'--k' if k is not None else '--synthetic'} ask for different things (a tree, a chain)", "give one of them")
        rows = ([trees.tree] if trees is not None and trees.tree is not None else []) + (list(trees.grid) if trees is not None else [])
        row = next((r for r in rows if _tree_text(r) == tree), None)
        if row is None:
            raise InputError(f"--tree {tree}: {source.name} did not estimate this tree", "pick one of the result's tree grid (its trees section), or re-run diagnose with this --tree")
        return _tree_dict(row, "--tree")
    if engine not in (SGLANG, TRTLLM) or k is not None or synthetic or trees is None:
        return None
    if trees.tree is not None:
        return _tree_dict(trees.tree, "the result's own tree")
    best, chain = trees.best_tree, result.metric("speedup_best")
    if best is not None and best.speedup is not None and chain is not None and best.speedup > chain:
        return _tree_dict(best, f"the result's best tree, faster than its best chain ({_f(best.speedup)}× vs {_f(chain)}×)")
    return None


def _tree_text(row: Any) -> str:
    return json.dumps(row.paths, separators=(",", ":")) if row.paths else f"steps={row.steps},topk={row.topk},tokens={row.tokens}"


def _tree_dict(row: Any, why: str) -> dict[str, Any]:
    return {"steps": row.steps, "topk": row.topk, "tokens": row.tokens, "paths": row.paths, "tau": row.tau_tokens, "speedup": row.speedup, "why": why}


def export_config(result: Result, source: Path, engine: str, k: int | None = None, synthetic: bool = False, output: Path | None = None, tree: str | None = None, tree_given: bool = False, forced: bool = False) -> Export:
    """The engine's config text and the note it rests on. vLLM writes its JSON unless the
    output is a .yaml/.yml file (then a `vllm serve --config` YAML). SGLang and TensorRT-LLM
    get a draft tree where `choose_tree` picks one."""
    chosen_tree = choose_tree(result, source, engine, k, synthetic, tree, tree_given)
    p = plan(result, source, engine, k, synthetic)
    if chosen_tree is not None:
        t = chosen_tree
        if t["paths"] and engine == SGLANG:
            raise InputError("SGLang builds its draft trees dynamically (steps, topk, num-draft-tokens); a static tree of rank paths is not one of its knobs", "export it for --engine trtllm (eagle_choices), or pick a steps=S,topk=T,tokens=N tree")
        p.tree = t
        p.k = t["steps"]
        p.schedule = None
        shape = f"{len(t['paths'])} static nodes, depth {t['steps']}" if t["paths"] else f"steps {t['steps']}, topk {t['topk']}, {t['tokens']} tokens verified"
        p.notes.append(f"a draft tree ({shape}): {t['why']}; τ {_f(t['tau'])} tokens per verify step, speedup {_f(t['speedup'])}× (the K line above is the chain's)")
        p.speedup, p.speedup_at = t["speedup"], "its draft tree"
        p.prediction = f"prediction: speedup {_f(t['speedup'])}× for the draft tree ({shape}), τ = {_f(t['tau'])} tokens per verify step, from {source.resolve()}"
    if p.prediction:
        p.notes.insert(0, p.prediction + (" — below 1×, slower than plain decoding (SP301); written only because of --force" if forced else ""))
    if engine == VLLM:
        text = write_vllm(p, as_yaml=output is not None and output.suffix.lower() in (".yaml", ".yml"))
    elif engine == SGLANG:
        text = write_sglang(p)
    elif engine == LLAMA_CPP:
        text = write_llamacpp(p)
    else:
        text = write_trtllm(p)
    return Export(text=text, note=list(p.notes), plan=p)
