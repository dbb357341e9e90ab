"""The diagnose pipeline: prompts → reference continuations → teacher-forced scoring of
target vs drafter → accumulators → estimates → rules → a plain result dict (the JSON
schema every report renders). The CLI only wires flags into `DiagnoseConfig`."""

from __future__ import annotations

import hashlib
import json
import math
import platform
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from specprobe import __version__
from specprobe.alignment import BLOCKING_RULES, compare, effective_sampling
from specprobe.errors import ConfigError, InputError
from specprobe.metrics.accumulate import THRESHOLDS, Accumulator
from specprobe.options import DiagnoseConfig  # noqa: F401  (re-exported)
from specprobe.progress import Progress
from specprobe.prompts import Prompt, PromptSet, builtin_suite, load_prompts, select
from specprobe.rules import RuleTable, sort_findings, verdict, worst_severity

SCHEMA_VERSION = 1
ROW_FIELDS = ("accept_prob", "greedy_agree", "kl_target_draft_nats", "target_entropy_nats", "draft_confidence")


# ----------------------------------------------------------------------------- prompts
def load_prompt_set(cfg: DiagnoseConfig) -> PromptSet:
    ps = builtin_suite() if cfg.prompts == "builtin" else load_prompts(cfg.prompts)
    ps = select(ps, domains=cfg.domains, max_prompts=cfg.max_prompts)
    if cfg.reference == "dataset":
        missing = [p.id for p in ps.prompts if not p.reference]
        if missing:
            raise InputError(
                f"--reference dataset needs a response for every prompt; {len(missing)} have none (first: {missing[0]})",
                "give 'reference'/'response'/'answer' in the prompts file, or use the default on-policy references",
            )
    return ps


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """The first user turn, through the chat template when the model has one."""
    text = prompt.turns[0]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(x) for x in ids]
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return [int(x) for x in ids]


# ----------------------------------------------------------------------------- references
def _model_identity(loaded: Any) -> str:
    path = Path(loaded.info.path)
    files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    stamp = [(f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in files]
    return json.dumps([str(path), stamp])


class References(list):  # type: ignore[type-arg]
    """Continuations, one per prompt ([] where none was made); `interrupted` when Ctrl-C
    stopped generation part-way (the finished batches are on disk and in here)."""

    interrupted: bool = False


def generate_references(target: Any, encoded: list[list[int]], sampling: Any, cfg: DiagnoseConfig, progress: Progress) -> list[list[int]]:
    """On-policy continuations: sampled from the target with its own settings, seeded,
    batched (left padding), cached per batch on disk so an interrupted run resumes."""
    from transformers import GenerationConfig

    from specprobe.models.loader import cache_root

    tok = target.tokenizer
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    key_src = json.dumps([_model_identity(target), str(target.dtype), target.device, sampling.to_dict(), cfg.max_new_tokens, cfg.seed, cfg.batch_size, encoded])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:24]
    cache_file = cache_root() / "references" / f"{key}.jsonl"
    done: dict[int, list[list[int]]] = {}
    if cfg.use_cache and cache_file.is_file():
        for line in cache_file.read_text().splitlines():
            try:
                rec = json.loads(line)
                done[int(rec["batch"])] = rec["continuations"]
            except (ValueError, KeyError):
                continue  # a line cut by an interrupt: that batch is regenerated
    batches = [list(range(i, min(i + cfg.batch_size, len(encoded)))) for i in range(0, len(encoded), cfg.batch_size)]
    out = References([] for _ in encoded)
    gen_cfg = GenerationConfig(
        max_new_tokens=cfg.max_new_tokens,
        do_sample=not sampling.greedy,
        temperature=sampling.temperature if not sampling.greedy else 1.0,
        top_k=sampling.top_k or 0,
        top_p=sampling.top_p,
        min_p=sampling.min_p or None,
        pad_token_id=pad,
        eos_token_id=eos,
    )
    if cfg.use_cache:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
    with progress.task(f"generating on-policy references ({len(encoded)} prompts × ≤{cfg.max_new_tokens} tokens)", len(encoded)) as advance:
        try:
            _generate_batches(target, encoded, batches, done, out, gen_cfg, pad, eos, cache_file, cfg, advance)
        except KeyboardInterrupt:
            out.interrupted = True  # finished batches are kept (and cached); score those
    return out


def _generate_batches(target: Any, encoded: list[list[int]], batches: list[list[int]], done: dict[int, list[list[int]]], out: list[list[int]], gen_cfg: Any, pad: int, eos: int | None, cache_file: Path, cfg: DiagnoseConfig, advance: Any) -> None:
    """Generate batch by batch (reusing cached batches), appending each to the cache."""
    import torch

    for bi, idx in enumerate(batches):
        if bi in done and len(done[bi]) == len(idx):
            for j, i in enumerate(idx):
                out[i] = done[bi][j]
            advance(len(idx))
            continue
        width = max(len(encoded[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, width - len(encoded[i]) :] = torch.tensor(encoded[i])
            mask[r, width - len(encoded[i]) :] = 1
        torch.manual_seed(cfg.seed * 100_003 + bi)
        with torch.inference_mode():
            gen = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device), generation_config=gen_cfg)
        conts = []
        for r, i in enumerate(idx):
            c = gen[r, width:].tolist()
            if eos is not None and eos in c:
                c = c[: c.index(eos) + 1]
            while c and c[-1] == pad and pad != eos:
                c.pop()
            out[i] = c
            conts.append(c)
        if cfg.use_cache:
            with cache_file.open("a") as fh:
                fh.write(json.dumps({"batch": bi, "continuations": conts}) + "\n")
        advance(len(idx))


def dataset_references(tokenizer: Any, prompts: list[Prompt], max_new_tokens: int) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = tokenizer(p.reference or "", add_special_tokens=False)["input_ids"]
        out.append([int(x) for x in ids[:max_new_tokens]])
    return out


# ----------------------------------------------------------------------------- scoring
@dataclass
class Scored:
    acc: Accumulator
    rows: dict[str, list[Any]]
    interrupted: bool = False
    head_depths: tuple[int, ...] = ()  # depths a head drafter predicted directly (others chain depth 1)


def score(target: Any, drafter: Any, prompts: list[Prompt], encoded: list[list[int]], conts: list[list[int]], pair: Any, cfg: DiagnoseConfig, progress: Progress) -> Scored:
    """Teacher-forced scoring in batches; logits made and reduced chunk by chunk so memory
    stays bounded by batch_size × chunk_positions × vocab, whatever the number of prompts."""
    import torch

    from specprobe.metrics.core import position_metrics
    from specprobe.models.drafters import TargetPass

    acc = Accumulator(k_max=cfg.k_max)
    rows: dict[str, list[Any]] = {k: [] for k in ("prompt_id", "domain", "position", *ROW_FIELDS)}
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]) + len(conts[i]))
    order = [i for i in order if conts[i]]
    layers = drafter.target_layers_needed()
    lm_head = target.model.get_output_embeddings()
    interrupted = False
    head_depths: tuple[int, ...] = ()
    with progress.task(f"scoring target vs drafter ({sum(len(conts[i]) for i in order)} positions)", len(order)) as advance:
        try:
            for start in range(0, len(order), cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                seqs = [encoded[i] + conts[i] for i in idx]
                width = max(len(s) for s in seqs)
                ids = torch.full((len(idx), width), pad, dtype=torch.long)
                mask = torch.zeros((len(idx), width), dtype=torch.long)
                for r, s in enumerate(seqs):
                    ids[r, : len(s)] = torch.tensor(s)
                    mask[r, : len(s)] = 1
                ids, mask = ids.to(target.device), mask.to(target.device)
                with torch.inference_mode(), capture_layers(target.model, layers) as captured:
                    out = target.model.model(input_ids=ids, attention_mask=mask)
                    tp = TargetPass(ids, mask, out.last_hidden_state, dict(captured))
                    feats = drafter.hidden(tp)  # depth -> [B, S, H']
                    depths = sorted(d for d in feats if 1 <= d <= cfg.k_max)
                    head_depths = tuple(d for d in depths if d > 1)
                    # rows to score: position t predicts reference token t+1 (continuation only)
                    b_idx, t_idx, seg = [], [], []
                    for r, i in enumerate(idx):
                        p0, n = len(encoded[i]), len(conts[i])
                        b_idx.append(torch.full((n,), r))
                        t_idx.append(torch.arange(p0 - 1, p0 - 1 + n))
                        seg.append(n)
                    bsel, tsel = torch.cat(b_idx).to(ids.device), torch.cat(t_idx).to(ids.device)
                    parts: dict[str, list[np.ndarray]] = {f: [] for f in ROW_FIELDS}
                    head_alpha: dict[int, list[np.ndarray]] = {d: [] for d in depths if d > 1}
                    head_conf: dict[int, list[np.ndarray]] = {d: [] for d in depths if d > 1}
                    for c0 in range(0, bsel.numel(), cfg.chunk_positions):
                        bb, tt = bsel[c0 : c0 + cfg.chunk_positions], tsel[c0 : c0 + cfg.chunk_positions]
                        tl = lm_head(tp.last_hidden[bb, tt])  # [N, V]
                        for d in depths:
                            # the depth-d prediction of token t+1 is made at position t+1−d
                            src = (tt + 1 - d).clamp(min=0)
                            dl = drafter.logits(feats[d][bb, src], d)  # [N, V']
                            pm = position_metrics(tl, dl, pair.target, pair.draft)
                            if d == 1:
                                for f in ROW_FIELDS:
                                    parts[f].append(getattr(pm, f).float().cpu().numpy())
                            else:
                                ok = (tt + 1 - d >= 0).float()
                                head_alpha[d].append((pm.accept_prob * ok).cpu().numpy())
                                head_conf[d].append(pm.draft_confidence.float().cpu().numpy())
                            del dl, pm
                        del tl
                cat = {f: np.concatenate(parts[f]) for f in ROW_FIELDS}
                cat_alpha = {d: np.concatenate(v) for d, v in head_alpha.items()}
                cat_conf = {d: np.concatenate(v) for d, v in head_conf.items()}
                off = 0
                for r, i in enumerate(idx):
                    n = seg[r]
                    vals = {f: cat[f][off : off + n] for f in ROW_FIELDS}
                    positions = np.arange(len(encoded[i]), len(encoded[i]) + n)
                    acc.add_sequence(
                        prompts[i].domain, positions, vals,
                        alpha_by_depth={d: a[off : off + n] for d, a in cat_alpha.items()} or None,
                        confidence_by_depth={d: c[off : off + n] for d, c in cat_conf.items()} or None,
                    )
                    if cfg.keep_positions:
                        rows["prompt_id"].extend([prompts[i].id] * n)
                        rows["domain"].extend([prompts[i].domain] * n)
                        rows["position"].extend(positions.tolist())
                        for f in ROW_FIELDS:
                            rows[f].extend(np.round(vals[f], 6).tolist())
                    off += n
                advance(len(idx))
        except KeyboardInterrupt:
            interrupted = True
    return Scored(acc, rows, interrupted, head_depths)


@contextmanager
def capture_layers(model: Any, layers: tuple[int, ...]) -> Iterator[dict[int, Any]]:
    """Raw outputs of decoder layers 1..L (1-based, as hidden_states[N]) via forward hooks,
    so only the layers a drafter needs are kept — not all L+1 hidden states."""
    captured: dict[int, Any] = {}
    handles = []
    for n in layers:
        def hook(_mod: Any, _inp: Any, output: Any, n: int = n) -> None:
            captured[n] = output[0] if isinstance(output, tuple) else output
        handles.append(model.model.layers[n - 1].register_forward_hook(hook))
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()


def measure_cost_ratio(target: Any, drafter: Any, steps: int = 12, repeats: int = 3, prompt_len: int = 32) -> dict[str, Any]:
    """Drafter ÷ target time per decode step at batch 1 with a KV cache, on the device."""
    import torch

    from specprobe.models.loader import cache_kwarg, output_cache

    step_model = drafter.step_model()
    if step_model is None:
        return {"cost_ratio": float("nan"), "target_step_ms": float("nan"), "draft_step_ms": float("nan"), "measured": False}

    def one(model: Any) -> float:
        ids = torch.randint(0, min(1000, target.vocab_size), (1, prompt_len), generator=torch.Generator().manual_seed(0)).to(target.device)
        with torch.inference_mode():
            kw = cache_kwarg(model)
            out = model(input_ids=ids, use_cache=True)
            cache = output_cache(out)
            nxt = out.logits[:, -1:].argmax(-1)
            if target.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                out = model(input_ids=nxt, use_cache=True, **{kw: cache})
                cache = output_cache(out)
                nxt = out.logits[:, -1:].argmax(-1)
            if target.device.startswith("cuda"):
                torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    # interleave so drift on a shared machine hits both sides alike
    t_times, d_times = [], []
    for _ in range(repeats):
        t_times.append(one(target.model))
        d_times.append(one(step_model))
    t_ms, d_ms = statistics.median(t_times) * 1e3, statistics.median(d_times) * 1e3
    return {"cost_ratio": d_ms / t_ms, "target_step_ms": t_ms, "draft_step_ms": d_ms, "measured": True}


# ----------------------------------------------------------------------------- result
def _clean(x: Any) -> Any:
    """JSON-safe: nan/inf -> None, numpy -> python."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return None if math.isnan(v) or math.isinf(v) else v
    if isinstance(x, np.integer):
        return int(x)
    return x


def environment(device: str, dtype: Any) -> dict[str, Any]:
    from importlib import metadata

    pk: dict[str, str | None] = {}
    for name in ("torch", "transformers", "tokenizers", "safetensors", "gguf", "accelerate", "numpy", "scipy", "pandas", "typer", "rich", "pydantic"):
        try:
            pk[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pk[name] = None
    dev = device
    if device.startswith("cuda"):
        import torch

        dev = f"{device} ({torch.cuda.get_device_name(0)})"
    return {"device": dev, "dtype": str(dtype).replace("torch.", ""), "torch": pk["torch"], "transformers": pk["transformers"], "python": platform.python_version(), "platform": platform.platform(), "packages": pk}


def summarise(scored: Scored, cost: dict[str, Any], cfg: DiagnoseConfig) -> dict[str, Any]:
    """Accumulators + cost -> metrics, tables, depth curves, K table, adaptive K."""
    from specprobe import estimate

    acc = scored.acc
    s = acc.summary()
    c = cfg.cost_ratio if cfg.cost_ratio is not None else cost["cost_ratio"]
    if c is None or (isinstance(c, float) and math.isnan(c)):
        c = 0.0
    cum = acc.cumulative_depth().tolist()
    cond = estimate.conditional(cum)
    ktab = estimate.k_table(cum, float(s["accept_prob_mean"]), c, cfg.verify_factor) if acc.num_positions else []
    best = estimate.best_k(ktab) if ktab else None
    adaptive = estimate.adaptive_threshold(THRESHOLDS, acc.adaptive, c, cfg.verify_factor) if acc.num_positions else None
    dom = acc.by_domain()
    pos = acc.by_position()
    dom_alpha = [d["accept_prob_mean"] for d in dom if d["positions"]]
    metrics: dict[str, Any] = {
        "accept_prob_mean": s["accept_prob_mean"],
        "greedy_agree_frac": s["greedy_agree_frac"],
        "kl_target_draft_nats": s["kl_target_draft_nats"],
        "kl_target_draft_p90_nats": acc.kl_percentile(0.9),
        "tv_mean": s["tv_mean"],
        "target_entropy_nats": s["target_entropy_nats"],
        "draft_confidence_mean": s["draft_confidence_mean"],
        "accept_prob_domain_min": min(dom_alpha) if dom_alpha else None,
        "accept_prob_domain_spread": (max(dom_alpha) - min(dom_alpha)) if len(dom_alpha) > 1 else None,
        "accept_prob_high_entropy": acc.high_entropy_accept,
        "accept_prob_long_context_ratio": (pos[-1]["accept_prob_mean"] / pos[0]["accept_prob_mean"]) if len(pos) > 1 and pos[0]["accept_prob_mean"] > 0 and pos[-1]["positions"] >= 32 else None,
        "cond_accept_depth_decay": (cond[-1] / cond[0]) if cond and cond[0] and not math.isnan(cond[-1]) else None,
        "tau_tokens": best.tau_tokens if best else None,
        "accept_rate_best_k": best.accept_rate if best else None,
        "best_k": best.k if best else None,
        "speedup_best": best.speedup if best else None,
        "speedup_adaptive": adaptive.speedup if adaptive else None,
        "cost_ratio": c,
        "num_positions": acc.num_positions,
        "num_prompts": acc.num_prompts,
        "reference_off_policy": int(cfg.reference == "dataset"),
    }
    return {
        "metrics": metrics,
        "by_domain": dom,
        "by_entropy": acc.by_entropy(),
        "by_position": pos,
        "histograms": acc.histograms(),
        "depth": {"depth": list(range(1, cfg.k_max + 1)), "cumulative": cum, "conditional": cond, "source": "estimate", "head_depths": list(scored.head_depths)},
        "k_table": [asdict(r) for r in ktab],
        "best_k": best.k if best else None,
        "adaptive": asdict(adaptive) if adaptive else None,
        "cost": {**cost, "cost_ratio": c, "verify_factor": cfg.verify_factor, "measured": cost.get("measured", False) and cfg.cost_ratio is None},
        "accumulator": acc.to_state(),
    }


def evaluate_rules(table: RuleTable, metrics: dict[str, Any], kind: str, evidence: dict[str, list[str]] | None = None, families: tuple[str, ...] = ("0", "1", "2", "3")) -> tuple[list[Any], list[dict[str, Any]]]:
    evals = table.evaluate(metrics, kind=kind, families=families, evidence=evidence)
    findings = sort_findings([e.finding for e in evals if e.finding is not None])
    summary = [{"rule_id": e.rule.id, "name": e.rule.name, "severity": e.rule.severity, "status": e.status} for e in evals]
    return findings, summary


# ----------------------------------------------------------------------------- pipeline
@dataclass
class Pair:
    target: Any
    drafter: Any
    sampling: Any
    alignment: Any


def load_pair(cfg: DiagnoseConfig, progress: Progress, target: Any = None, drafter: Any = None) -> Pair:
    """Load target + drafter and run the alignment check (no forward pass yet)."""
    from specprobe.models.drafters import build_drafter, drafter_info
    from specprobe.models.loader import load_info, load_model

    if target is None:
        progress.note(f"loading target {cfg.target}")
        tinfo = load_info(cfg.target, progress)
        dinfo = drafter_info(cfg.drafter, tinfo, progress)
        target = load_model(cfg.target, cfg.device, cfg.dtype, progress, info=tinfo)
    if drafter is None:
        dinfo = drafter_info(cfg.drafter, target.info, progress)
        progress.note(f"building drafter {cfg.drafter}")
        drafter = build_drafter(cfg.drafter, target, cfg.device, cfg.dtype, progress, info=None if dinfo is target.info else dinfo)
    draft_gen = None if drafter.info is target.info else drafter.info.generation_config
    pair = effective_sampling(cfg.sampling, target.info.generation_config, draft_gen)
    return Pair(target, drafter, pair, compare(target.info, drafter.info, pair))


def run_diagnose(cfg: DiagnoseConfig, progress: Progress | None = None, table: RuleTable | None = None, pair: Pair | None = None) -> dict[str, Any]:
    """The whole diagnose job; returns the result dict (JSON schema v1)."""
    from specprobe.rules import load_table

    progress = progress or Progress()
    if cfg.k_max < 1 or cfg.k_max > 32:
        raise ConfigError(f"--k-max {cfg.k_max} is out of range", "use 1 ≤ K ≤ 32")
    if cfg.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {cfg.max_new_tokens} must be at least 1", "use e.g. 64")
    if cfg.batch_size < 1:
        raise ConfigError(f"--batch-size {cfg.batch_size} must be at least 1", "use e.g. 8")
    table = table or load_table([Path(p) for p in cfg.rules])
    prompt_set = load_prompt_set(cfg)
    pair = pair or load_pair(cfg, progress)
    target, drafter = pair.target, pair.drafter
    align = pair.alignment
    metrics: dict[str, Any] = dict(align.metrics)
    findings0, _ = evaluate_rules(table, metrics, drafter.kind, align.evidence, families=("0",))
    blocking = [f for f in findings0 if f.rule_id in BLOCKING_RULES and f.severity == "error"]
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "command": "diagnose",
        "specprobe_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.to_dict(),
        "environment": environment(target.device, target.dtype),
        "target": {"spec": cfg.target, "name": target.name, "num_layers": target.num_layers, "vocab_size": target.vocab_size, "params": target.params},
        "drafter": {"spec": cfg.drafter, "kind": drafter.kind, "name": drafter.name, "num_layers": drafter.num_layers, "params": drafter.params},
        "prompt_set": {"name": prompt_set.name, "source": prompt_set.source, "sha256": prompt_set.sha256, "num_prompts": len(prompt_set.prompts), "domains": prompt_set.domains},
        "reference": "off-policy" if cfg.reference == "dataset" else "on-policy",
        "sampling": {"target": pair.sampling.target.to_dict(), "draft": pair.sampling.draft.to_dict(), "sources": pair.sampling.sources},
        "alignment": {"facts": align.facts, "evidence": align.evidence},
        "interrupted": False,
        "scored": False,
    }
    if blocking and not cfg.force:
        result["metrics"] = metrics
        findings, evals = evaluate_rules(table, metrics, drafter.kind, align.evidence)
        result.update(_verdict_block(findings, evals))
        result["stopped"] = f"alignment errors ({', '.join(f.rule_id for f in blocking)}) make scoring meaningless; no forward pass was run (use --force to score anyway)"
        return result

    prompts = list(prompt_set.prompts)
    encoded = [encode_prompt(target.tokenizer, p) for p in prompts]
    ctx = getattr(target.config, "max_position_embeddings", None)
    for p, e in zip(prompts, encoded, strict=True):
        if ctx and len(e) + cfg.max_new_tokens > ctx:
            raise InputError(f"prompt {p.id} is {len(e)} tokens; with --max-new-tokens {cfg.max_new_tokens} it exceeds the target's context of {ctx}", "shorten the prompt or lower --max-new-tokens")
    if cfg.reference == "dataset":
        conts = dataset_references(target.tokenizer, prompts, cfg.max_new_tokens)
    else:
        conts = generate_references(target, encoded, pair.sampling.target, cfg, progress)
    if getattr(conts, "interrupted", False):
        progress.note("interrupted while generating references: scoring the prompts finished so far")
        scored = score(target, drafter, prompts, encoded, conts, pair.sampling, cfg, progress)
        scored.interrupted = True
    else:
        scored = score(target, drafter, prompts, encoded, conts, pair.sampling, cfg, progress)
    progress.note("measuring the drafter/target cost ratio on the device")
    cost = measure_cost_ratio(target, drafter) if cfg.cost_ratio is None else {"cost_ratio": cfg.cost_ratio, "target_step_ms": None, "draft_step_ms": None, "measured": False}
    summary = summarise(scored, cost, cfg)
    metrics.update(summary.pop("metrics"))
    summary.pop("accumulator")
    result.update(summary)
    result["metrics"] = metrics
    result["scored"] = True
    result["interrupted"] = scored.interrupted
    if cfg.keep_positions:
        result["positions"] = scored.rows
    findings, evals = evaluate_rules(table, metrics, drafter.kind, align.evidence)
    result.update(_verdict_block(findings, evals))
    return _clean(result)


def _verdict_block(findings: list[Any], evals: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "verdict": verdict(findings, default="no findings"),
        "worst_severity": worst_severity(findings),
        "findings": [f.to_dict() for f in findings],
        "evaluations": evals,
    }
