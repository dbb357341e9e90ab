"""Pre-flight checks of a head against its target, from config.json and tensor headers
only (plus the small d2t/t2d buffers): catalogue metrics, evidence lines and facts that
the SP0xx head rules turn into findings.

What each check guards against, in the engines' own terms:
- hidden sizes: EAGLE-3's fc reads 3 target states (3·Ht), EAGLE-1's fc and MTP's
  eh_proj read [embedding; hidden] (2·H), Medusa blocks are H wide;
- d2t/t2d: vLLM maps draft id i to i + d2t[i]; the ids must be in range and strictly
  increasing, and t2d must mark exactly those Vd ids;
- d2t absent while Vd ≠ V: vLLM keeps zero offsets and reads draft id i as target id i;
- aux layer ids: outside [0, L] nothing (or the wrong state) is captured, and vLLM and
  SGLang read explicit ids one layer apart;
- norm_before_residual absent from a speculators config: vLLM assumes true, the
  speculators library false;
- the verifier named in speculators_config, and the layer model type vLLM runs;
- an embedding the head lacks and cannot share; Medusa heads or MTP layers declared
  but not stored;
- a serving K beyond the heads a Medusa/MTP checkpoint has;
- rope theta and scaling of a head that shares the target's positions (EAGLE-1/2,
  EAGLE-3, MTP): the engine feeds it the target's position ids and builds its rotary
  table from the head's own config, so a head config with another rope encodes the same
  positions differently from the states it reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from specprobe.engines import get
from specprobe.models.heads.layout import EAGLE3_LAYER_TYPES, HeadLayout, aux_layers_by_engine
from specprobe.models.heads.medusa import block_names
from specprobe.models.heads.vocab import d2t_problems

MAX_LINES = 5
# transformers' Llama default, which a config without rope settings gets
DEFAULT_ROPE_THETA = 10000.0
ROPE_THETA_REL_TOL = 1e-3


@dataclass
class HeadReport:
    metrics: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, list[str]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, metric: str, value: Any, *lines: str) -> None:
        self.metrics[metric] = value
        if lines:
            self.evidence.setdefault(metric, []).extend(lines)


def _tcfg(target_config: Any, key: str, default: Any = None) -> Any:
    if isinstance(target_config, dict):
        return target_config.get(key, default)
    return getattr(target_config, key, default)


def head_checks(layout: HeadLayout, target_info: Any, serving_k: int | None = None) -> HeadReport:
    """Every head check for this layout against the target (ModelInfo; no weights)."""
    tc = target_info.config
    ht = int(_tcfg(tc, "hidden_size", 0) or 0)
    vt = int(_tcfg(tc, "vocab_size", 0) or 0)
    nl = int(_tcfg(tc, "num_hidden_layers", 0) or 0)
    r = HeadReport()
    r.facts = {"kind": layout.kind, "layout": layout.layout, "path": str(layout.path), "hidden_size": layout.hidden_size, "depths": layout.depths}
    if layout.kind == "eagle3":
        _eagle3(layout, target_info, ht, vt, nl, r)
    elif layout.kind == "eagle":
        _eagle1(layout, ht, r)
    elif layout.kind == "medusa":
        _medusa(layout, ht, vt, r)
    else:
        _mtp(layout, ht, r)
    if layout.kind in ("eagle", "eagle3", "mtp"):
        _rope(layout, tc, r)
    if layout.kind in ("medusa", "mtp") and serving_k is not None and layout.depths:
        excess = max(0, int(serving_k) - int(layout.depths))
        r.add("spec_tokens_beyond_heads", excess, f"serving K = {serving_k}; the checkpoint has {layout.depths} {'heads' if layout.kind == 'medusa' else 'MTP layers'}")
    return r


# ----------------------------------------------------------------------------- EAGLE-3
def _eagle3(layout: HeadLayout, target_info: Any, ht: int, vt: int, nl: int, r: HeadReport) -> None:
    d, f = layout.details, layout.files
    h = layout.hidden_size
    lines: list[str] = []
    ids = d["aux_ids"]
    n_aux = len(ids) if ids else 3
    fc = f.shape(d["root"] + "fc.weight")
    want = n_aux * ht
    if fc is None:
        lines.append("fc.weight is missing")
    elif fc[1] != want:
        lines.append(f"fc.weight reads {fc[1]} features; {n_aux} target states × hidden {ht} = {want}")
    if d["target_hidden_size"] is not None and d["target_hidden_size"] != ht:
        lines.append(f"target_hidden_size is {d['target_hidden_size']}; the target's hidden size is {ht}")
    q = f.shape(d["prefix"] + "self_attn.q_proj.weight")
    if q is not None and q[1] != 2 * h:
        lines.append(f"{d['prefix']}self_attn.q_proj reads {q[1]} features, not 2 × the head's hidden {h}")
    r.add("hidden_size_mismatch", int(bool(lines)), *lines)
    r.facts["hidden"] = {"head": h, "target": ht, "fc_in": fc[1] if fc else None}

    # draft vocabulary and its map
    lm = f.shape(d["lm_head"]) if d["lm_head"] else None
    vd = int(lm[0]) if lm else layout.draft_vocab_size
    r.facts["vocab"] = {"draft": vd, "target": vt, "d2t": bool(d["d2t"]), "t2d": bool(d["t2d"])}
    r.add("d2t_missing", int(d["d2t"] is None and vd != vt), *([f"draft vocabulary {vd} ≠ target vocabulary {vt} and no d2t: vLLM reads draft id i as target id i"] if d["d2t"] is None and vd != vt else []))
    if d["d2t"] is not None:
        _d2t(layout, vd, vt, r)

    # aux layers: what each engine reads
    by = aux_layers_by_engine(ids, nl)
    engine = get(d["aux_engine"]).label
    bad = [k for k in by[d["aux_engine"]] if not 0 <= k <= nl]
    r.add("aux_layer_out_of_range", len(bad), *([f"{d['aux_key'] or 'default ids'} = {list(ids) if ids else '(2, L//2, L−3)'}: {engine} reads hidden_states{list(by[d['aux_engine']])}, which must lie in [0, {nl}] for a target of {nl} layers"] if bad else []))
    differ = len(set(by.values())) > 1
    r.add("aux_layers_engines_differ", int(differ))
    r.evidence["aux_layers_engines_differ"] = [
        f"{d['aux_key'] or 'no ids: default (2, L//2, L−3)'} {list(ids) if ids else ''}".rstrip()
        + "; " + ", ".join(f"{get(name).label}{' reads' if i == 0 else ''} hidden_states{list(v)}" for i, (name, v) in enumerate(by.items()))
        + f"; specprobe scores with {engine}'s (the convention the {d['format']} format is trained with)"
    ]
    r.facts["aux_layers"] = {"ids": list(ids) if ids else None, **{name: list(v) for name, v in by.items()}, "scored": list(by[d["aux_engine"]])}

    if d["format"] == "speculators":
        unset = d["norm_before_residual_declared"] is None
        r.add("norm_before_residual_unset", int(unset), *(["norm_before_residual is absent: vLLM runs the head with true, the speculators library defaults to false; specprobe scores it as vLLM does"] if unset else []))
        _verifier(d.get("verifier"), target_info, r)
        mt = d["layer_model_type"]
        unsupported = mt not in EAGLE3_LAYER_TYPES
        r.add("eagle3_layer_type_unsupported", int(unsupported), *([f"transformer_layer_config.model_type is {mt or 'missing'!r}; vLLM runs EAGLE-3 layers of type {', '.join(EAGLE3_LAYER_TYPES)}"] if unsupported else []))
    _embedding(layout, ht, r)


def _d2t(layout: HeadLayout, vd: int, vt: int, r: HeadReport) -> None:
    d = layout.details
    names = [d["d2t"]] + ([d["t2d"]] if d["t2d"] else [])
    t = layout.files.load(names)
    d2t, t2d = t[d["d2t"]], t.get(d["t2d"]) if d["t2d"] else None
    lines: list[str] = []
    if d2t.dim() != 1 or d2t.is_floating_point():
        r.add("d2t_invalid_frac", 1.0, f"d2t has shape {list(d2t.shape)} and dtype {str(d2t.dtype).replace('torch.', '')}; it must be [{vd}] integer offsets")
        r.add("d2t_all_zero", 0)
        return
    p = d2t_problems(d2t, t2d, vt)
    n = int(d2t.shape[0])
    frac = float(p["invalid"].float().mean()) if n else 1.0
    if n != vd:
        lines.append(f"d2t has {n} entries; the draft vocabulary (lm_head rows) has {vd}")
        frac = 1.0
    ids = p["ids"]
    for key, what in (("out_of_range", f"maps outside [0, {vt})"), ("not_increasing", "is not above the previous draft id's"), ("unmarked", "is not marked in t2d")):
        bad = p.get(key)
        if bad is not None and bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            lines.append(f"{int(bad.sum())} draft ids' target id {what}; first: draft {i} → {int(ids[i])}")
    r.add("d2t_invalid_frac", frac, *lines[:MAX_LINES])
    all_zero = int(p["all_zero"] and vd < vt)
    r.add("d2t_all_zero", all_zero, *([f"every d2t offset is 0: draft id i is read as target id i (only the first {vd} of {vt} target ids)"] if all_zero else []))
    if t2d is not None:
        t_lines = []
        if p["t2d_len"] != vt:
            t_lines.append(f"t2d has {p['t2d_len']} entries; the target vocabulary has {vt}")
        if p["t2d_count"] != vd:
            t_lines.append(f"t2d marks {p['t2d_count']} target ids; the draft vocabulary has {vd}")
        if p["t2d_extra"]:
            t_lines.append(f"t2d marks {p['t2d_extra']} target ids no draft id maps to")
        r.add("t2d_inconsistent", int(bool(t_lines)), *t_lines)


def _norm_name(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def _verifier(verifier: Any, target_info: Any, r: HeadReport) -> None:
    if not isinstance(verifier, dict):
        r.add("verifier_mismatch", 0)
        return
    name = str(verifier.get("name_or_path") or "")
    archs = [str(a) for a in verifier.get("architectures") or []]
    tc = target_info.config
    t_archs = [str(a) for a in (_tcfg(tc, "architectures") or [])]
    cands = {_norm_name(str(x).rstrip("/").split("/")[-1]) for x in (target_info.name, _tcfg(tc, "_name_or_path", "") or "", getattr(target_info, "path", "") or "") if x}
    cands.discard("")
    a = _norm_name(name.rstrip("/").split("/")[-1])
    name_ok = not a or not cands or any(c in a or a in c for c in cands)
    arch_ok = not archs or not t_archs or bool(set(archs) & set(t_archs))
    bad = not (name_ok and arch_ok)
    lines = []
    if not name_ok:
        lines.append(f"speculators_config.verifier is {name!r}; the target is {target_info.name!r}")
    if not arch_ok:
        lines.append(f"verifier architectures {archs}; the target's {t_archs}")
    r.add("verifier_mismatch", int(bad), *lines)
    r.facts["verifier"] = {"name_or_path": name or None, "architectures": archs or None}


def _embedding(layout: HeadLayout, ht: int, r: HeadReport) -> None:
    """A head without embed_tokens borrows the target's, which needs hidden sizes to agree."""
    own = layout.details.get("embed")
    bad = own is None and layout.hidden_size != ht
    r.add("embedding_unshareable", int(bad), *([f"no embed_tokens in the head and the target's embedding is {ht} wide, the head {layout.hidden_size}"] if bad else []))
    r.facts["embedding"] = "own" if own else "the target's"


# ----------------------------------------------------------------------------- EAGLE-1, Medusa, MTP
def _eagle1(layout: HeadLayout, ht: int, r: HeadReport) -> None:
    root = layout.details["root"]
    fc = layout.files.shape(root + "fc.weight")
    lines = [] if fc and fc[1] == 2 * ht and fc[0] == ht else [f"fc.weight is {list(fc or [])}; EAGLE-1 needs [{ht}, {2 * ht}] over [embedding; hidden] of this target"]
    r.add("hidden_size_mismatch", int(bool(lines)), *lines)
    _embedding(layout, ht, r)


def _medusa(layout: HeadLayout, ht: int, vt: int, r: HeadReport) -> None:
    d, f = layout.details, layout.files
    lines = []
    missing: list[tuple[int, str]] = []
    for h in range(d["num_heads"]):
        for layer in range(d["num_layers"]):
            w, _ = block_names(layout, h, layer)
            s = f.shape(w)
            if s is None:
                missing.append((h, w))
            elif tuple(s) != (ht, ht):
                lines.append(f"{w} is {list(s)}; the target's hidden size is {ht}")
        lm = d["own_lm_head"].get(h)
        if lm and (f.shape(lm) or (0, 0))[1] != ht:
            lines.append(f"{lm} is {list(f.shape(lm) or [])}; it must read {ht} features")
    r.add("hidden_size_mismatch", int(bool(lines)), *lines[:MAX_LINES])
    heads_missing = sorted({h for h, w in missing})
    r.add("head_weights_missing", len(heads_missing), *[f"Medusa head {h}: {w} is missing" for h, w in missing[:MAX_LINES]])
    r.facts["heads"] = {"num_heads": d["num_heads"], "num_layers": d["num_layers"], "lm_head": "own" if d["own_lm_head"] else "the target's"}


def _mtp(layout: HeadLayout, ht: int, r: HeadReport) -> None:
    d = layout.details
    lines = [f"layer {k}: projection is {list(s)}; [{ht}, {2 * ht}] expected" for k, s in d["proj_shapes"].items() if s is not None and tuple(s) != (ht, 2 * ht)]
    r.add("hidden_size_mismatch", int(bool(lines)), *lines)
    miss = d["missing"]
    r.add("head_weights_missing", len(miss), *[f"MTP layer {k} ({d['prefixes'][k]}): {', '.join(v[:3])}{' …' if len(v) > 3 else ''} missing" for k, v in list(miss.items())[:MAX_LINES]])
    r.facts["mtp"] = {"layers": d["num_layers"], "declared": d["declared"], "concat": "[hidden; embed]" if d["hidden_first"] else "[embed; hidden]"}


# ----------------------------------------------------------------------------- rope
def rope_settings(config: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope theta, scaling) of a config dict or object, in either spelling: transformers
    5's rope_parameters {rope_theta, rope_type, …} or the older rope_theta + rope_scaling.
    Scaling None means plain rope (rope_type default)."""
    params = _tcfg(config, "rope_parameters")
    scaling = _tcfg(config, "rope_scaling")
    merged: dict[str, Any] = {}
    for part in (scaling, params):
        if isinstance(part, dict):
            merged.update(part)
    theta = merged.pop("rope_theta", None)
    if theta is None:
        theta = _tcfg(config, "rope_theta")
    kind = merged.pop("rope_type", merged.pop("type", None))
    if kind not in (None, "default") or merged:
        return float(theta if theta is not None else DEFAULT_ROPE_THETA), {"rope_type": kind or "default", **merged}
    return float(theta if theta is not None else DEFAULT_ROPE_THETA), None


def _same_scaling(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    if set(a) != set(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            if abs(float(x) - float(y)) > 1e-6 * max(1.0, abs(float(y))):
                return False
        elif x != y:
            return False
    return True


def _rope(layout: HeadLayout, target_config: Any, r: HeadReport) -> None:
    """A head's rope against the target's: the head reads the target's states at the
    target's positions, and the engine rotates its queries and keys with its own config's
    rope (MTP layers run with the target's own config)."""
    t_theta, t_scaling = rope_settings(target_config)
    if layout.kind == "mtp":
        h_theta, h_scaling = t_theta, t_scaling
    else:
        h_theta, h_scaling = rope_settings(layout.details.get("layer_config") or layout.config)
    rel = abs(h_theta - t_theta) / t_theta if t_theta else 0.0
    r.metrics["rope_theta_target"], r.metrics["rope_theta_head"] = t_theta, h_theta
    r.add("head_rope_theta_rel_diff", rel, *([f"rope_theta: head {h_theta:g}, target {t_theta:g}"] if rel > ROPE_THETA_REL_TOL else []))
    bad = not _same_scaling(h_scaling, t_scaling)
    r.add("head_rope_scaling_mismatch", int(bad), *([f"rope scaling: head {h_scaling or 'none'}, target {t_scaling or 'none'}"] if bad else []))
    r.facts["rope"] = {"head": {"theta": h_theta, "scaling": h_scaling}, "target": {"theta": t_theta, "scaling": t_scaling}}
