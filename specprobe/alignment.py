"""Pre-flight alignment checks (no forward pass): vocab, token→id mapping, special tokens,
chat template, normalizer/pre-tokenizer, context length and sampling settings.

Produces catalogue metrics plus evidence lines; the rules table (family SP0xx) turns
them into findings, so every finding carries a rule id and the measured values."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from specprobe.metrics.sampling import Sampling

MAX_EXAMPLES = 5
# Alignment errors after which scoring is meaningless (ids mean other tokens).
BLOCKING_RULES = ("SP001", "SP003", "SP005", "SP015", "SP016")


@dataclass(frozen=True)
class SamplingFlags:
    """Sampling settings from the command line; None means 'not given'."""

    temperature: float | None = None
    draft_temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    draft_top_k: int | None = None
    draft_top_p: float | None = None


@dataclass
class SamplingPair:
    target: Sampling
    draft: Sampling
    sources: dict[str, str] = field(default_factory=dict)


def _explicit(gen: Any) -> dict[str, Any]:
    """Generation-config values the checkpoint actually sets (not library defaults)."""
    if gen is None:
        return {}
    try:
        return dict(gen.to_diff_dict())
    except Exception:
        return {}


def effective_sampling(flags: SamplingFlags, target_gen: Any, draft_gen: Any | None) -> SamplingPair:
    """Resolve each side's sampling the way serving engines do: an explicit setting wins,
    then the checkpoint's generation_config.json, then defaults (temperature 1, no
    truncation). The drafter falls back to the target's settings, as engines share one
    SamplingParams — unless its own generation_config or a --draft-* flag says otherwise."""
    tg = _explicit(target_gen)
    dg = _explicit(draft_gen) if draft_gen is not None else {}
    src: dict[str, str] = {}

    def pick(flag: Any, gen: dict[str, Any], key: str, default: Any, side: str) -> Any:
        if flag is not None:
            src[f"{side}.{key}"] = "flag"
            return flag
        if key in gen and gen[key] is not None:
            src[f"{side}.{key}"] = "generation_config"
            return gen[key]
        src[f"{side}.{key}"] = "default"
        return default

    t_temp = float(pick(flags.temperature, tg, "temperature", 1.0, "target"))
    if flags.temperature is None and tg.get("do_sample") is False:
        t_temp, src["target.temperature"] = 0.0, "generation_config (do_sample=false)"
    target = Sampling(
        temperature=t_temp,
        top_k=int(pick(flags.top_k, tg, "top_k", 0, "target") or 0),
        top_p=float(pick(flags.top_p, tg, "top_p", 1.0, "target")),
        min_p=float(pick(flags.min_p, tg, "min_p", 0.0, "target")),
    )
    d_temp = float(pick(flags.draft_temperature, dg, "temperature", target.temperature, "draft"))
    if flags.draft_temperature is None and dg.get("do_sample") is False:
        d_temp, src["draft.temperature"] = 0.0, "generation_config (do_sample=false)"
    if src["draft.temperature"] == "default":
        src["draft.temperature"] = "target's"
    draft = Sampling(
        temperature=d_temp,
        top_k=int(pick(flags.draft_top_k, dg, "top_k", target.top_k, "draft") or 0),
        top_p=float(pick(flags.draft_top_p, dg, "top_p", target.top_p, "draft")),
        min_p=target.min_p,
    )
    return SamplingPair(target, draft, src)


@dataclass
class AlignmentReport:
    metrics: dict[str, Any]
    evidence: dict[str, list[str]]
    facts: dict[str, Any]


def _ids(tok: Any, cfg: Any, gen: Any, name: str) -> set[int]:
    out: set[int] = set()
    for src in (tok, cfg, gen):
        if src is None:
            continue
        v = getattr(src, f"{name}_token_id", None)
        if isinstance(v, int):
            out.add(v)
        elif isinstance(v, (list, tuple)):
            out.update(int(x) for x in v if isinstance(x, int))
    return out


def _tokenizer_part(tok: Any, part: str) -> Any:
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        return json.loads(backend.to_str()).get(part)
    except Exception:
        return None


def _special_tokens(tok: Any) -> dict[str, int]:
    decoder = getattr(tok, "added_tokens_decoder", {}) or {}
    return {str(t.content if hasattr(t, "content") else t): int(i) for i, t in decoder.items()}


def compare(target_info: Any, draft_info: Any, sampling: SamplingPair) -> AlignmentReport:
    """All alignment metrics between two ModelInfo objects (tokenizer + configs)."""
    m: dict[str, Any] = {}
    ev: dict[str, list[str]] = {}
    same = target_info is draft_info
    tt, dt = target_info.tokenizer, draft_info.tokenizer
    tc, dc = target_info.config, draft_info.config

    vt = int(getattr(tc, "vocab_size", 0) or len(tt))
    vd = int(getattr(dc, "vocab_size", 0) or len(dt))
    m["vocab_size_target"], m["vocab_size_draft"], m["vocab_size_diff"] = vt, vd, abs(vt - vd)
    m["tokenizer_size_diff"] = abs(len(tt) - len(dt))

    if same:
        m["token_id_mismatch_count"], m["token_id_mismatch_frac"] = 0, 0.0
    else:
        tv, dv = tt.get_vocab(), dt.get_vocab()
        bad = [(s, i, dv.get(s)) for s, i in tv.items() if dv.get(s) != i]
        bad.sort(key=lambda x: x[1])
        m["token_id_mismatch_count"] = len(bad)
        m["token_id_mismatch_frac"] = len(bad) / max(len(tv), 1)
        ev["token_id_mismatch_frac"] = [
            f"{s!r}: target id {i} → drafter id {'missing' if d is None else d}" for s, i, d in bad[:MAX_EXAMPLES]
        ]
        ev["token_id_mismatch_count"] = []

    for name in ("bos", "eos", "pad", "unk"):
        ti = _ids(tt, tc, target_info.generation_config, name)
        di = _ids(dt, dc, draft_info.generation_config, name)
        if name in ("bos", "pad", "unk"):
            # tokenizer's own id decides; configs often omit these
            ti = {x for x in [getattr(tt, f"{name}_token_id", None)] if x is not None} or ti
            di = {x for x in [getattr(dt, f"{name}_token_id", None)] if x is not None} or di
        mism = bool(ti and di and ti != di) or (bool(ti) != bool(di) and name in ("bos", "eos"))
        m[f"{name}_id_mismatch"] = int(mism)
        if mism:
            ev[f"{name}_id_mismatch"] = [f"{name.upper()} ids: target {sorted(ti)} vs drafter {sorted(di)}"]

    ts, ds = _special_tokens(tt), _special_tokens(dt)
    diff = sorted(set(ts.items()) ^ set(ds.items()))
    m["special_tokens_mismatch_count"] = len({c for c, _ in diff})
    if diff:
        ev["special_tokens_mismatch_count"] = [
            f"{c!r}: target {ts.get(c, 'missing')} vs drafter {ds.get(c, 'missing')}" for c in dict.fromkeys(c for c, _ in diff)
        ][:MAX_EXAMPLES]

    tct, dct = getattr(tt, "chat_template", None), getattr(dt, "chat_template", None)
    m["chat_template_mismatch"] = int(tct != dct)
    if tct != dct:
        ev["chat_template_mismatch"] = [
            f"target template: {'none' if tct is None else f'{len(tct)} chars'}; drafter: {'none' if dct is None else f'{len(dct)} chars'}"
        ]
    for part, key in (("normalizer", "normalizer_mismatch"), ("pre_tokenizer", "pretokenizer_mismatch")):
        a, b = _tokenizer_part(tt, part), _tokenizer_part(dt, part)
        m[key] = int(a != b)
        if a != b:
            ev[key] = [f"{part}: target {json.dumps(a)[:80]} vs drafter {json.dumps(b)[:80]}"]

    ct = getattr(tc, "max_position_embeddings", None)
    cd = getattr(dc, "max_position_embeddings", None)
    m["context_length_target_tokens"] = ct
    m["context_length_draft_tokens"] = cd
    m["context_length_deficit_tokens"] = max(0, ct - cd) if isinstance(ct, int) and isinstance(cd, int) else None

    t, d = sampling.target, sampling.draft
    m["temperature_target"], m["temperature_draft"] = t.temperature, d.temperature
    m["temperature_abs_diff"] = abs(t.temperature - d.temperature)
    m["draft_greedy_target_sampling"] = int(d.greedy and not t.greedy)
    m["top_k_mismatch"] = int((t.top_k or 0) != (d.top_k or 0))
    m["top_p_mismatch"] = int(abs(t.top_p - d.top_p) > 1e-9)
    ev["temperature_abs_diff"] = [f"target temperature from {sampling.sources.get('target.temperature')}, drafter from {sampling.sources.get('draft.temperature')}"]
    ev["draft_greedy_target_sampling"] = ev["temperature_abs_diff"]

    facts = {
        "target": {"name": target_info.name, "vocab": vt, "tokenizer": len(tt), "context": ct, "sampling": t.describe()},
        "drafter": {"name": draft_info.name, "vocab": vd, "tokenizer": len(dt), "context": cd, "sampling": d.describe()},
        "sampling_sources": sampling.sources,
    }
    return AlignmentReport(m, ev, facts)
