"""Pre-flight alignment checks (no forward pass): vocab, token→id mapping, special tokens,
chat template, normalizer/pre-tokenizer, context length and sampling settings.

Produces catalogue metrics plus evidence lines; the rules table (family SP0xx) turns
them into findings, so every finding carries a rule id and the measured values.

The checks follow the engine the numbers are for (`specprobe.engines`): whether it drafts
greedily (then the drafter's temperature changes nothing it proposes), which vocabulary
differences it accepts (vLLM: equal vocab_size for a draft model unless
use_heterogeneous_vocab; llama.cpp: `common_speculative_are_compatible`), and the context
it serves. Given the loaded models (diagnose), the weights' scale is checked too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from specprobe.core.errors import ConfigError
from specprobe.engines import (
    DEFAULT,
    DEFAULT_SEMANTICS,
    DRAFT_SAMPLING,
    GREEDY,
    PROBABILISTIC,
    get,
    sampling_order,
)
from specprobe.metrics.sampling import Sampling
from specprobe.models.anatomy import final_norm
from specprobe.models.heads.checks import head_checks
from specprobe.settings.pipeline import SamplingFlags

MAX_EXAMPLES = 5
# Alignment errors after which scoring is meaningless (ids mean other tokens).
BLOCKING_RULES = ("SP001", "SP003", "SP005", "SP015", "SP016", "SP020", "SP022", "SP027", "SP028")
_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")
_PENALTIES = (("repetition_penalty", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0))


@dataclass
class SamplingPair:
    target: Sampling
    draft: Sampling
    sources: dict[str, str] = field(default_factory=dict)
    # the drafter's own generation_config sampling (None: the drafter is the target):
    # reported only, since engines sample both models with one set of parameters
    draft_own: dict[str, float] | None = None
    # sampling written in config files (probe config, serving configs), by file name
    declared: dict[str, dict[str, float]] = field(default_factory=dict)
    engine: str = DEFAULT  # whose draft-and-verify procedure (`specprobe.engines`)
    drafting: str | None = None  # greedy | probabilistic; None: the engine's own

    @property
    def resolved_drafting(self) -> str:
        return get(self.engine).drafting(self.drafting)


def _explicit(gen: Any) -> dict[str, Any]:
    """Generation-config values the checkpoint actually sets (not library defaults)."""
    if gen is None:
        return {}
    try:
        return dict(gen.to_diff_dict())
    except Exception:
        return {}


def own_sampling(gen: Any) -> dict[str, float]:
    """What a checkpoint's generation_config.json asks for, with transformers' defaults
    where it is silent (temperature 1.0; 0 when it turns sampling off)."""
    g = _explicit(gen)
    out = {k: float(g[k]) for k in _SAMPLING_KEYS if g.get(k) is not None}
    out.setdefault("temperature", 1.0)
    if g.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def declared_gaps(declared: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Largest minus smallest value of each sampling key that two or more config files
    set: {"temperature": 0.3} when one says 0.7 and another 1.0. Keys set once or
    everywhere alike give 0."""
    out: dict[str, float] = {}
    for key in _SAMPLING_KEYS:
        vals = [float(v[key]) for v in declared.values() if v.get(key) is not None]
        out[key] = max(vals) - min(vals) if len(vals) > 1 else 0.0
    return out


def effective_sampling(
    flags: SamplingFlags,
    target_gen: Any,
    draft_gen: Any | None,
    declared: Mapping[str, Mapping[str, float]] | None = None,
    *,
    engine: str = DEFAULT,
    drafting: str | None = None,
) -> SamplingPair:
    """The sampling the serving engine will apply: a flag (or serving config, passed as
    flags) wins, then the TARGET's generation_config.json, then the engine's defaults.

    vLLM, SGLang and transformers' assisted generation all sample the drafter with the
    request's one set of parameters, so the drafter gets the target's settings unless a
    --draft-* flag (or a serving config's draft settings) says otherwise. The drafter's
    own generation_config (draft_gen; None when the drafter is the target) is only
    recorded in `draft_own`, for an info-level finding. `engine` and `drafting` (greedy |
    probabilistic; None: the engine's own) travel on the pair, resolved, for `compare`."""
    eng = get(engine)
    if drafting is not None and drafting not in DRAFT_SAMPLING:
        raise ConfigError(f"draft sampling {drafting!r} is not one of {', '.join(DRAFT_SAMPLING)}", "use --draft-sampling greedy or probabilistic")
    sem = flags.sampling_semantics
    order = sampling_order(sem)
    tg = _explicit(target_gen)
    src: dict[str, str] = {"semantics": "flag" if sem != DEFAULT_SEMANTICS else "default"}

    def pick(flag: Any, key: str, default: Any, default_src: str = "default") -> Any:
        if flag is not None:
            src[f"target.{key}"] = "flag"
            return flag
        if tg.get(key) is not None:
            src[f"target.{key}"] = "generation_config"
            return tg[key]
        src[f"target.{key}"] = default_src
        return default

    t_temp = float(pick(flags.temperature, "temperature", 1.0))
    # do_sample matters only where the engine's sampling reads it (transformers): the
    # others read temperature/top-k/top-p/min-p from generation_config.json and ignore it
    if order.greedy_without_do_sample and flags.temperature is None and tg.get("do_sample") is not True:
        t_temp = 0.0
        src["target.temperature"] = "generation_config (do_sample=false)" if "do_sample" in tg else f"{sem} default (do_sample unset)"
    top_k_default = (order.top_k_default, f"{sem} default") if order.top_k_default else (0, "default")
    penalties = {k: float(pick(getattr(flags, k), k, d)) for k, d in _PENALTIES}
    target = Sampling(
        temperature=t_temp,
        top_k=int(pick(flags.top_k, "top_k", *top_k_default) or 0),
        top_p=float(pick(flags.top_p, "top_p", 1.0)),
        min_p=float(pick(flags.min_p, "min_p", 0.0)),
        semantics=sem,  # type: ignore[arg-type]
        **penalties,
    )
    # an engine that draws a sampled draft at the temperature alone leaves q untruncated
    bare = eng.draft_temperature_only and eng.drafting(drafting) == PROBABILISTIC and target.truncates
    for key, flag in (("temperature", flags.draft_temperature), ("top_k", flags.draft_top_k), ("top_p", flags.draft_top_p)):
        src[f"draft.{key}"] = "flag" if flag is not None else f"off ({eng.label} samples drafts at the temperature only)" if bare and key != "temperature" else "target's"
    draft = Sampling(
        temperature=float(flags.draft_temperature) if flags.draft_temperature is not None else target.temperature,
        top_k=int(flags.draft_top_k or 0) if flags.draft_top_k is not None else 0 if bare else target.top_k,
        top_p=float(flags.draft_top_p) if flags.draft_top_p is not None else 1.0 if bare else target.top_p,
        min_p=0.0 if bare else target.min_p,
        semantics=target.semantics,
        **penalties,
    )
    own = None if draft_gen is None else own_sampling(draft_gen)
    return SamplingPair(target, draft, src, own, {k: dict(v) for k, v in (declared or {}).items()}, engine, eng.drafting(drafting))


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


def _tokenizer_json(tok: Any) -> dict[str, Any]:
    """The fast tokenizer's own description (model, normalizer, pre-tokenizer), parsed once."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return {}
    try:
        out = json.loads(backend.to_str())
    except Exception:
        return {}
    return out if isinstance(out, dict) else {}


def _special_tokens(tok: Any) -> dict[str, int]:
    decoder = getattr(tok, "added_tokens_decoder", {}) or {}
    return {str(t.content if hasattr(t, "content") else t): int(i) for i, t in decoder.items()}


# ----------------------------------------------------------------------------- the engine's procedure
def _drafting(sampling: SamplingPair, m: dict[str, Any], ev: dict[str, list[str]], facts: dict[str, Any]) -> None:
    """Under greedy drafting the engine proposes argmax q, which no temperature moves:
    the drafter's temperature (and a greedy drafter against a sampling target) is then the
    engine's design, not a mismatch."""
    engine, drafting = sampling.engine, sampling.resolved_drafting
    facts["engine"], facts["drafting"] = engine, drafting
    greedy = drafting == GREEDY
    m["draft_temperature_applies"] = int(not greedy)
    given = sampling.sources.get("draft.temperature") not in (None, "target's")
    m["draft_temperature_ignored"] = int(greedy and given)
    e = get(engine)
    line = e.describe(drafting)
    facts["procedure"] = line
    ev["draft_temperature_applies"] = [line]
    ev.setdefault("temperature_abs_diff", []).append(line)
    if greedy:
        knob = e.greedy_knob(e.draft_sampling == GREEDY)
        ev["draft_temperature_ignored"] = [
            f"{e.label} drafts the drafter's top token ({knob}): the drafter's temperature does not change its drafts",
            f"drafter temperature {sampling.draft.temperature:g} from {sampling.sources.get('draft.temperature')}; {line}",
        ]


# ----------------------------------------------------------------------------- vocabularies as the engines pair them
def _engine_vocab(engine: str, tt: Any, dt: Any, vt: int, vd: int, tj: Mapping[str, Any], dj: Mapping[str, Any], m: dict[str, Any], ev: dict[str, list[str]]) -> None:
    """Whether the engine pairs the two vocabularies as they are, in its own terms."""
    get(engine).vocab_findings(tt, dt, vt, vd, tj, dj, m, ev)


# ----------------------------------------------------------------------------- the weights' scale (diagnose)
SCALE_SAMPLE_ROWS = 2048
_SCALE_PROBES = 256


def _embedding_rms(embed: Any, vocab: int) -> float:
    """Median RMS of the rows the embedding module returns (a scaled embedding's own
    multiplier included), over evenly spaced ids past the specials."""
    ids = torch.linspace(min(4, vocab - 1), vocab - 1, min(SCALE_SAMPLE_ROWS, vocab)).long().unique()
    w = getattr(embed, "weight", None)
    dev = w.device if w is not None else "cpu"
    with torch.inference_mode():
        rows = embed(ids.to(dev)).float()
    return float(rows.pow(2).mean(-1).sqrt().median())


def _logit_scale(model: Any, head: Any) -> float:
    """How far the model spreads its logits for a hidden state of unit RMS: std over the
    vocabulary of head(final_norm(u)), u ~ N(0, 1), median over probes, per √width (so
    drafters of another width compare per coordinate). The final norm's weight, the LM
    head's rows and the architecture's post-head transform all enter."""
    norm = final_norm(model)
    w = model.get_output_embeddings().weight
    width = int(w.shape[1])
    u = torch.randn(_SCALE_PROBES, width, generator=torch.Generator().manual_seed(0)).to(device=w.device, dtype=w.dtype)
    with torch.inference_mode():
        logits = head(norm(u)).float()
    return float(logits.std(-1).median()) / width**0.5


def scale_checks(target: Any, drafter: Any) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Drafter/target ratios of the embedding scale and the logit scale, from the loaded
    weights (no forward pass over text). A self-draft shares the target's tensors (1 by
    construction); a head is measured on the embedding it reads raw (EAGLE-1: fc over
    [embedding; hidden]); EAGLE-3 and MTP normalise their embedding first, and a head's
    LM head reads its own features, so neither ratio is taken for them."""
    m: dict[str, Any] = {"embedding_scale_ratio": None, "logit_scale_ratio": None}
    ev: dict[str, list[str]] = {}
    kind = getattr(drafter, "kind", "independent")
    tm = target.model
    vt = int(tm.get_input_embeddings().weight.shape[0])
    loaded = getattr(drafter, "loaded", None)
    t_emb = _embedding_rms(tm.get_input_embeddings(), vt)
    if kind == "layer_skip" or (kind == "independent" and loaded is None):
        m["embedding_scale_ratio"] = m["logit_scale_ratio"] = 1.0
        return m, ev
    if loaded is not None:
        dm = loaded.model
        d_emb = _embedding_rms(dm.get_input_embeddings(), int(dm.get_input_embeddings().weight.shape[0]))
        t_log, d_log = _logit_scale(tm, target.head), _logit_scale(dm, loaded.head)
        m["logit_scale_ratio"] = d_log / t_log if t_log > 0 else None
        ev["logit_scale_ratio"] = [
            f"logit spread per √width for a unit-RMS hidden state through final norm and LM head: drafter {d_log:.4g}, target {t_log:.4g}"
        ]
    elif kind == "eagle":
        drafter.ensure_built()  # the head's modules load on first use; scoring needs them next anyway
        d_emb = _embedding_rms(drafter.embed, vt)
    else:
        return m, ev
    m["embedding_scale_ratio"] = d_emb / t_emb if t_emb > 0 else None
    ev["embedding_scale_ratio"] = [f"median RMS of the embedding rows: drafter {d_emb:.4g}, target {t_emb:.4g}"]
    return m, ev


# ----------------------------------------------------------------------------- compare
def compare(target_info: Any, draft_info: Any, sampling: SamplingPair, *, serving_context: int | None = None, models: tuple[Any, Any] | None = None) -> AlignmentReport:
    """All alignment metrics between two ModelInfo objects (tokenizer + configs).

    serving_context: the context the engine serves (a serving config's max_model_len),
    when known; the drafter's window is held to it instead of the target's. models: the
    loaded (target, drafter), which adds the weight-scale ratios (diagnose; check loads
    no weights)."""
    m: dict[str, Any] = {}
    ev: dict[str, list[str]] = {}
    same = target_info is draft_info
    tt, dt = target_info.tokenizer, draft_info.tokenizer
    tc, dc = target_info.config, draft_info.config
    tj = _tokenizer_json(tt)
    dj = tj if dt is tt else _tokenizer_json(dt)
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
        a, b = tj.get(part), dj.get(part)
        m[key] = int(a != b)
        if a != b:
            ev[key] = [f"{part}: target {json.dumps(a)[:80]} vs drafter {json.dumps(b)[:80]}"]

    ct = getattr(tc, "max_position_embeddings", None)
    cd = getattr(dc, "max_position_embeddings", None)
    m["context_length_target_tokens"] = ct
    m["context_length_draft_tokens"] = cd
    m["context_length_serving_tokens"] = serving_context
    # the context the engine serves: the serving config's when given, else the target's
    served = serving_context if serving_context is not None else ct
    m["context_length_deficit_tokens"] = max(0, served - cd) if isinstance(served, int) and isinstance(cd, int) else None
    if isinstance(served, int) and isinstance(cd, int) and served > cd:
        where = "the serving config's max_model_len" if serving_context is not None else "the target's max_position_embeddings"
        ev["context_length_deficit_tokens"] = [f"the engine serves up to {served} tokens ({where}); the drafter's max_position_embeddings is {cd}"]

    if same:
        m["engine_vocab_incompatible"], m["vocab_shared_frac"] = 0, 1.0
    elif (getattr(draft_info, "extra", None) or {}).get("head") is None:
        _engine_vocab(sampling.engine, tt, dt, vt, vd, tj, dj, m, ev)
    if same or (getattr(draft_info, "extra", None) or {}).get("head") is not None:
        m["engine_draft_unsupported"] = 0 if same else None
    else:
        get(sampling.engine).draft_model_findings(dc, m, ev)

    t, d = sampling.target, sampling.draft
    m["temperature_target"], m["temperature_draft"] = t.temperature, d.temperature
    m["temperature_abs_diff"] = abs(t.temperature - d.temperature)
    m["draft_greedy_target_sampling"] = int(d.greedy and not t.greedy)
    m["top_k_mismatch"] = int((t.top_k or 0) != (d.top_k or 0))
    m["top_p_mismatch"] = int(abs(t.top_p - d.top_p) > 1e-9)
    ev["temperature_abs_diff"] = [f"target temperature from {sampling.sources.get('target.temperature')}, drafter from {sampling.sources.get('draft.temperature')}"]
    ev["draft_greedy_target_sampling"] = ev["temperature_abs_diff"]
    # the drafter's own generation_config: what it would ask for, reported against what
    # the engine will actually give it (absent file = transformers' temperature 1.0)
    own = sampling.draft_own
    m["draft_own_temperature_diff"] = None if own is None else abs(own["temperature"] - d.temperature)
    if own is not None:
        ev["draft_own_temperature_diff"] = [
            f"drafter's generation_config asks for temperature {own['temperature']:g}"
            + ("" if _explicit(draft_info.generation_config).get("temperature") is not None else " (none set: transformers default)")
            + f"; the engine samples it at {d.temperature:g} ({sampling.sources.get('draft.temperature')})"
        ]
    gaps = declared_gaps(sampling.declared)
    m["temperature_config_gap"] = gaps["temperature"]
    if any(gaps.values()):
        ev["temperature_config_gap"] = [
            f"{key} differs: " + ", ".join(f"{name} {vals[key]:g}" for name, vals in sampling.declared.items() if vals.get(key) is not None)
            for key, gap in gaps.items()
            if gap > 0
        ]
    m["sampling_penalties_set"] = int(t.penalised)
    if t.penalised:
        ev["sampling_penalties_set"] = [
            f"repetition_penalty {t.repetition_penalty:g} ({sampling.sources.get('target.repetition_penalty')}), "
            f"frequency_penalty {t.frequency_penalty:g} ({sampling.sources.get('target.frequency_penalty')}), "
            f"presence_penalty {t.presence_penalty:g} ({sampling.sources.get('target.presence_penalty')})"
        ]

    facts: dict[str, Any] = {
        "target": {"name": target_info.name, "vocab": vt, "tokenizer": len(tt), "context": ct, "sampling": t.describe()},
        "drafter": {"name": draft_info.name, "vocab": vd, "tokenizer": len(dt), "context": cd, "sampling": d.describe()},
        "sampling_sources": sampling.sources,
        "sampling_semantics": t.semantics,
        "drafter_own_sampling": sampling.draft_own,
    }
    _drafting(sampling, m, ev, facts)
    head = (getattr(draft_info, "extra", None) or {}).get("head")
    if head is not None:  # a head drafter: its shapes, vocabulary map and layers too
        hr = head_checks(head, target_info, draft_info.extra.get("serving_k"))
        m.update(hr.metrics)
        ev.update(hr.evidence)
        facts["head"] = hr.facts
    if models is not None:
        sm, sev = scale_checks(*models)
        m.update(sm)
        ev.update(sev)
    return AlignmentReport(m, ev, facts)
