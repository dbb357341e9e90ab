"""Retraining data where the drafter is weakest: the result's worst prompts (by their own
α where the result kept its per-position rows, else by the α of their category or domain),
with the target's own on-policy answers — the very references the result scored, every
turn, read back from the on-disk reference cache (`probe.references`: the cache is keyed
by the target's weights, dtype, device, sampling, token budget, seed, batch size and the
encoded prompts, all of which the result records) — in the training tool's format:

SpecForge (specforge/data/parse.py)
  JSONL, one conversation a line: {"id", "conversations": [{"role", "content"}, …]}; the
  parser drops a leading non-user turn and truncates a conversation where an assistant
  turn follows anything but a user turn, so the turns alternate user, assistant, …
speculators (src/speculators/data_generation/preprocessing.py)
  JSONL rows that carry `input_ids` and `loss_mask` pass through as on-policy data (no
  re-rendering): one row per assistant turn, the conversation as the target was prompted
  (its chat template, the earlier on-policy answers) masked 0, the answer's tokens 1;
  `conversations` (role/content) rides along for reading.

With a manifest.json: the target, its sampling, the engine and drafting the result
followed, the findings that motivated the export, and why each prompt was chosen.

Needs the target's tokenizer (no weights); imports transformers/torch only here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from specprobe.core.errors import InputError, SpecprobeError
from specprobe.core.files import make_temp_dir
from specprobe.result import Result

SPECFORGE, SPECULATORS = "specforge", "speculators"


class _NotCached(SpecprobeError):
    """A batch of references the cache does not hold (the export never generates)."""


class _CacheOnlyModel:
    """Stands in for the target's weights: any use (a generation) means the reference
    was not in the cache."""

    def __getattr__(self, name: str) -> Any:
        raise _NotCached("references missing from the cache")


def _rerun_hint(result: Result, source: Path) -> str:
    c = result.config
    parts = [f"specprobe diagnose {c.target} {c.drafter}"]
    if c.prompts and c.prompts != "builtin":
        parts.append(f"--prompts {c.prompts}")
    return f"run '{' '.join(parts)} …' again with the settings {source.name} records (same sampling, --max-new-tokens, --seed, --batch-size; not --no-cache) to regenerate them, then export"


def weakest(result: Result, prompts: Sequence[Any], budget: int) -> list[tuple[Any, float | None, str]]:
    """(prompt, α, why) for the `budget` prompts where the drafter is weakest: by each
    prompt's own mean α over its positions (all turns) when the result kept them, else
    every prompt of the worst category (or domain) first."""
    by_id = {p.id: p for p in prompts}
    pos = result.positions
    if pos is not None and pos.prompt_id:
        sums: dict[str, list[float]] = {}
        for pid, a in zip(pos.prompt_id, pos.accept_prob, strict=False):
            if a is not None:
                sums.setdefault(pid.split("#", 1)[0], []).append(float(a))
        ranked = sorted(((sum(v) / len(v), pid) for pid, v in sums.items() if pid in by_id), key=lambda t: (t[0], t[1]))
        return [(by_id[pid], a, f"its own α {a:.3f} over {len(sums[pid])} positions") for a, pid in ranked[:budget]]
    cats = result.categories
    rows, attr = (cats, "category") if cats else (result.by_domain, "domain")
    alpha = {r.group: r.accept_prob_mean for r in rows}
    if not alpha:
        raise InputError("the result has neither per-position rows nor a per-domain table to rank prompts by", "re-run diagnose (it keeps per-position rows unless --no-keep-positions)")
    order = sorted(prompts, key=lambda p: (alpha.get(getattr(p, attr), float("inf")) if alpha.get(getattr(p, attr)) is not None else float("inf"), p.id))
    return [(p, alpha.get(getattr(p, attr)), f"its {attr} {getattr(p, attr)!r} has α {alpha.get(getattr(p, attr)) or float('nan'):.3f}") for p in order[:budget]]


def _config(result: Result) -> Any:
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags

    d = result.config.model_dump()
    flag_names = {f.name for f in fields(SamplingFlags)}
    sampling = SamplingFlags(**{k: d.pop(k) for k in list(d) if k in flag_names and d.get(k) is not None})
    names = {f.name for f in fields(DiagnoseConfig)} - {"sampling"}
    return DiagnoseConfig(**{k: v for k, v in d.items() if k in names and v is not None}, sampling=sampling)


def references(result: Result, source: Path, note: Callable[[str], None]) -> tuple[Any, Any, Any]:
    """(prompts, TurnReferences, tokenizer): the references the result scored, from the
    cache; InputError (one line, what to do) where they are not there."""
    from specprobe.core.progress import Progress
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.loader import load_info, resolve_dtype
    from specprobe.probe.references import (
        _cache_file,
        encode_prompts,
        load_prompt_set,
        references_by_turn,
    )

    if result.reference != "on-policy":
        raise InputError(f"{source.name} scored the dataset's own responses, not the target's", "diagnose with on-policy references (the default) and export that result")
    if result.config.use_cache is False:
        raise InputError(f"{source.name} was run with --no-cache: its references were never kept", _rerun_hint(result, source))
    if result.context_lengths:
        raise InputError(f"{source.name} scored prompts built to context lengths (--context-lengths); their references are not exported", "export a diagnose result of the prompt set as given")
    if result.sampling is None or result.environment is None or result.prompt_set is None:
        raise InputError(f"{source.name} records no sampling, environment or prompt set", "export a result of 'specprobe diagnose'")
    cfg = _config(result)
    prompt_set = load_prompt_set(cfg)
    if prompt_set.sha256 != result.prompt_set.sha256:
        raise InputError(f"the prompts at {cfg.prompts} are not the ones {source.name} scored (their content changed)", "restore the prompt file the result used, or re-run diagnose on these prompts")
    info = load_info(cfg.target)
    env = result.environment
    device = env.device.split(" ", 1)[0]  # "cuda (NVIDIA …)" → "cuda"
    served = getattr(result.target, "quant", None)  # weights quantized after loading, an fp8 KV cache: keyed apart
    target = SimpleNamespace(
        info=info, tokenizer=info.tokenizer, config=info.config, dtype=resolve_dtype(env.dtype, device), device=device, vocab_size=result.target.vocab_size, model=_CacheOnlyModel(),
        quant=SimpleNamespace(scheme=served.weights) if served is not None and served.weights else None, kv_cache_dtype=served.kv_cache_dtype if served is not None else None,
    )
    sampling = Sampling(**{k: v for k, v in result.sampling.target.model_dump().items() if v is not None})
    prompts = list(prompt_set.prompts)
    first = _cache_file(target, encode_prompts(target, prompts, cfg.max_new_tokens), sampling, cfg)
    if not first.is_file():
        raise InputError(f"the references {source.name} scored are not in the reference cache ({first.parent}: no {first.name})", _rerun_hint(result, source))
    try:
        refs = references_by_turn(target, prompts, cfg, sampling, Progress())
    except _NotCached:
        raise InputError(f"some of the references {source.name} scored (a batch or a later turn) are not in the reference cache {first.parent}", _rerun_hint(result, source)) from None
    note(f"references of {len(refs.items)} prompt turns read from the reference cache {first.parent}")
    return prompts, refs, info.tokenizer


def _turns(prompt: Any, refs: Any, tok: Any) -> list[tuple[list[dict[str, str]], list[int], list[int]]]:
    """Per turn of one prompt: (the conversation up to its answer, the encoded prompt, the
    answer's tokens), for the turns that have references."""
    at = {it.id: i for i, it in enumerate(refs.items)}
    out = []
    answers: list[str] = []
    for turn in range(prompt.num_turns):
        i = at.get(prompt.id if turn == 0 else f"{prompt.id}#{turn + 1}")
        if i is None or not refs.conts[i]:
            break
        text = tok.decode(refs.conts[i], skip_special_tokens=True)
        conv = [*prompt.messages(turn, answers), {"role": "assistant", "content": text}]
        out.append((conv, list(refs.encoded[i]), list(refs.conts[i])))
        answers.append(text)
    return out


def export_training(result: Result, source: Path, tool: str, out_dir: Path, budget: int, progress_note: Callable[[str], None] = lambda m: None) -> list[Path]:
    """Write the data and manifest into out_dir (built in a temporary folder next to it,
    then renamed into place: an interrupted export leaves nothing half-written)."""
    prompts, refs, tok = references(result, source, progress_note)
    chosen = weakest(result, prompts, budget)
    rows: list[dict[str, Any]] = []
    picked: list[dict[str, Any]] = []
    for p, a, why in chosen:
        turns = _turns(p, refs, tok)
        if not turns:
            continue
        picked.append({"id": p.id, "domain": p.domain, "category": p.category, "accept_prob": a, "why": why, "turns": len(turns)})
        if tool == SPECFORGE:
            rows.append({"id": p.id, "conversations": turns[-1][0]})
        else:
            for t, (conv, enc, cont) in enumerate(turns):
                rows.append({"id": p.id if t == 0 else f"{p.id}#{t + 1}", "conversations": conv, "input_ids": enc + cont, "loss_mask": [0] * len(enc) + [1] * len(cont)})
    if not rows:
        raise InputError(f"none of the {len(chosen)} weakest prompts has a reference in {source.name}'s run", "re-run diagnose and export that result")
    manifest = {
        "written_by": "specprobe export --training",
        "format": {SPECFORGE: "SpecForge conversation JSONL: {id, conversations: [{role, content}, …]}", SPECULATORS: "speculators on-policy rows: {id, conversations, input_ids, loss_mask} (loss_mask 1 on the target's answer)"}[tool],
        "result": str(source),
        "target": result.target.spec,
        "drafter": result.drafter.spec,
        "sampling": result.sampling.target.model_dump() if result.sampling else None,
        "max_new_tokens": result.config.max_new_tokens,
        "seed": result.config.seed,
        "engine": result.procedure.engine if result.procedure else None,
        "drafting": result.procedure.drafting if result.procedure else None,
        "accept_prob_mean": result.metric("accept_prob_mean"),
        "best_k": result.best_k,
        "verdict": result.verdict,
        "findings": [{"rule": f.rule_id, "name": f.name, "severity": f.severity, "message": f.message, "remedy": f.remedy} for f in result.findings],
        "selection": "by each prompt's own α (per-position rows)" if result.positions is not None and result.positions.prompt_id else "by the α of its category or domain",
        "budget": budget,
        "prompts": picked,
    }
    data_name = "train.jsonl"
    out_dir = Path(out_dir)
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(parent, out_dir.name)
    try:
        (tmp / data_name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        if out_dir.exists():
            for name in (data_name, "manifest.json"):
                (tmp / name).replace(out_dir / name)
            tmp.rmdir()
        else:
            tmp.replace(out_dir)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out_dir / data_name, out_dir / "manifest.json"]


def read_back(tool: str, path: Path) -> list[dict[str, Any]]:
    """The export read with the format's rules (for the tests and for a user's check):
    ids unique; each conversation starts with a user turn (after an optional system
    turn) and alternates user, assistant, ending with the assistant's answer; for
    speculators, input_ids and loss_mask of one length with the answer's tokens 1."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("ids are not unique")
    for r in rows:
        conv = r["conversations"]
        turns = conv[1:] if conv and conv[0]["role"] == "system" else conv
        roles = [m["role"] for m in turns]
        if not roles or roles[0] != "user" or roles[-1] != "assistant" or any(roles[i] == roles[i + 1] for i in range(len(roles) - 1)):
            raise ValueError(f"{r['id']}: roles do not alternate user, assistant: {roles}")
        if any(not isinstance(m.get("content"), str) for m in conv):
            raise ValueError(f"{r['id']}: a turn without text content")
        if tool == SPECULATORS and (len(r["input_ids"]) != len(r["loss_mask"]) or not any(r["loss_mask"])):
            raise ValueError(f"{r['id']}: input_ids and loss_mask disagree, or nothing is supervised")
    return rows
