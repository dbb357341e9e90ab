"""EAGLE heads: EAGLE-1/2 (one Llama layer over fc([embedding; final hidden]), the
target's LM head) and EAGLE-3 in both on-disk layouts — the EAGLE/SpecForge export
(`LlamaForCausalLMEagle3`, tensors `midlayer.*`) and the speculators layout vLLM loads
(`speculators_model_type: eagle3`, `transformer_layer_config`, tensors `layers.0.*`).

EAGLE-3 step (vLLM `llama_eagle3.py`, SGLang `llama_eagle3.py`): the first step's hidden
input is fc(cat of three target residual states); every step concatenates
[input_layernorm(embed(token)); hidden_norm(hidden)] (2·H) into attention, adds it to the
residual — the raw hidden, or its hidden_norm when `norm_before_residual` — then the
MLP; the pre-norm output is the next step's hidden, norm(output) goes to the head's own
LM head over its draft vocabulary, mapped to target ids with d2t.
"""

from __future__ import annotations

from typing import Any

from specprobe.core.errors import ModelLoadError
from specprobe.engines import eagle3_engine
from specprobe.models.heads.chain import (
    MAX_CHAIN,
    ChainedFeatures,
    HeadDrafter,
    chain_mask,
    positions,
    shifted_tokens,
)
from specprobe.models.heads.files import HeadFiles
from specprobe.models.heads.layout import HeadLayout, aux_layers_by_engine, int_tuple
from specprobe.models.heads.vocab import target_ids


# ----------------------------------------------------------------------------- layouts
def _root(files: HeadFiles) -> str:
    """'' or 'model.': where the head's tensors live."""
    return "model." if files.has("model.fc.weight") and not files.has("fc.weight") else ""


def describe_eagle3(files: HeadFiles) -> HeadLayout | None:
    cfg = files.config
    stype = cfg.get("speculators_model_type")
    archs = [str(a) for a in cfg.get("architectures") or []]
    root = _root(files)
    has_mid = bool(files.with_prefix(root + "midlayer."))
    if stype is not None:
        if stype != "eagle3":
            raise ModelLoadError(f"{files.folder}: speculators model type {stype!r} is not supported", "specprobe reads speculators EAGLE-3 heads (speculators_model_type: eagle3)")
        fmt, layer_cfg = "speculators", dict(cfg.get("transformer_layer_config") or {})
    elif has_mid or any("eagle3" in a.lower() for a in archs):
        fmt, layer_cfg = "eagle", dict(cfg)
    else:
        return None
    prefix = root + ("midlayer." if has_mid else "layers.0.")
    fc = files.shape(root + "fc.weight")
    hidden = int(layer_cfg.get("hidden_size") or (fc[0] if fc else 0))
    lm = files.shape(root + "lm_head.weight") or files.shape("lm_head.weight")
    vocab = int(layer_cfg.get("vocab_size") or cfg.get("vocab_size") or 0)
    draft_vocab = int(cfg.get("draft_vocab_size") or layer_cfg.get("draft_vocab_size") or (lm[0] if lm else vocab))
    eagle_cfg = cfg.get("eagle_config")
    eagle_cfg = eagle_cfg if isinstance(eagle_cfg, dict) else {}
    if fmt == "speculators":
        aux, aux_key = int_tuple(cfg.get("eagle_aux_hidden_state_layer_ids")), "eagle_aux_hidden_state_layer_ids"
        nbr_declared = cfg.get("norm_before_residual")
        # vLLM's speculators adapter: absent means true (the speculators library says false)
        nbr = True if nbr_declared is None else bool(nbr_declared)
        target_hidden = cfg.get("target_hidden_size")
        sc = cfg.get("speculators_config")
        sc = sc if isinstance(sc, dict) else {}
        verifier = sc.get("verifier") if isinstance(sc.get("verifier"), dict) else None
        methods = sc.get("proposal_methods") or [{}]
        spec_tokens = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    else:
        aux = int_tuple(cfg.get("eagle_aux_hidden_state_layer_ids")) or int_tuple(eagle_cfg.get("eagle_aux_hidden_state_layer_ids"))
        aux_key = "eagle_aux_hidden_state_layer_ids" if int_tuple(cfg.get("eagle_aux_hidden_state_layer_ids")) else "eagle_config.eagle_aux_hidden_state_layer_ids"
        nbr_declared = cfg.get("norm_before_residual")
        nbr = bool(nbr_declared) if nbr_declared is not None else False
        target_hidden, verifier, spec_tokens = cfg.get("target_hidden_size"), None, None
    details = {
        "format": fmt,
        "root": root,
        "prefix": prefix,
        "layer_config": layer_cfg,
        "layer_model_type": str(layer_cfg.get("model_type") or ("llama" if fmt == "eagle" else "")),
        "target_hidden_size": int(target_hidden) if isinstance(target_hidden, int) else None,
        "aux_ids": aux,
        "aux_key": aux_key if aux else None,
        # the engine whose capture convention the checkpoint was made for
        "aux_engine": eagle3_engine(fmt).name,
        "norm_before_residual": nbr,
        "norm_before_residual_declared": nbr_declared,
        "verifier": verifier,
        "speculative_tokens": spec_tokens,
        "num_layers": int(layer_cfg.get("num_hidden_layers") or 1),
        "d2t": root + "d2t" if files.has(root + "d2t") else None,
        "t2d": root + "t2d" if files.has(root + "t2d") else None,
        "embed": root + "embed_tokens.weight" if files.has(root + "embed_tokens.weight") else None,
        "lm_head": (root + "lm_head.weight") if files.has(root + "lm_head.weight") else ("lm_head.weight" if files.has("lm_head.weight") else None),
    }
    label = "EAGLE-3 (speculators)" if fmt == "speculators" else "EAGLE-3 (EAGLE/SpecForge export)"
    return HeadLayout("eagle3", label, files, hidden, vocab, draft_vocab, None, details)


def describe_eagle1(files: HeadFiles) -> HeadLayout | None:
    """EAGLE-1/2: fc [H, 2H] over [embedding; hidden] then Llama layers without the first
    input_layernorm; no norm or LM head of its own."""
    root = _root(files)
    fc = files.shape(root + "fc.weight")
    if fc is None or len(fc) != 2 or files.with_prefix(root + "midlayer.") or not files.with_prefix(root + "layers.0."):
        return None
    cfg = files.config
    hidden = int(cfg.get("hidden_size") or fc[0])
    layers = sorted({int(n[len(root) + 7 :].split(".")[0]) for n in files.with_prefix(root + "layers.")})
    details = {
        "format": "eagle1",
        "root": root,
        "layer_config": dict(cfg),
        "num_layers": len(layers),
        "fc_bias": files.has(root + "fc.bias"),
        "embed": root + "embed_tokens.weight" if files.has(root + "embed_tokens.weight") else None,
    }
    vocab = int(cfg.get("vocab_size") or 0)
    return HeadLayout("eagle", "EAGLE-1/2", files, hidden, vocab, vocab, None, details)


def scored_aux_layers(layout: HeadLayout, num_target_layers: int) -> tuple[int, ...]:
    """hidden_states indices specprobe feeds the head: those of the engine the checkpoint's
    format was made for (speculators -> vLLM, EAGLE/SpecForge export -> SGLang)."""
    by = aux_layers_by_engine(layout.details.get("aux_ids"), num_target_layers)
    return by[layout.details["aux_engine"]]


# ----------------------------------------------------------------------------- modules
def _load(module: Any, tensors: dict[str, Any], prefix: str, where: str) -> None:
    """Copy tensors named prefix+param into the module; every parameter must be there."""
    own = dict(module.named_parameters())
    missing = [k for k in own if prefix + k not in tensors]
    if missing:
        raise ModelLoadError(f"{where}: tensor {prefix + missing[0]} is missing ({len(missing)} missing)", "the checkpoint is incomplete or in another layout")
    for k, p in own.items():
        t = tensors[prefix + k]
        if tuple(t.shape) != tuple(p.shape):
            raise ModelLoadError(f"{where}: {prefix + k} has shape {list(t.shape)}, expected {list(p.shape)}", "the head does not match its own config (or this target)")
        p.data = t.to(p.dtype)


class _EagleBase(HeadDrafter):
    def _embedding(self, name: str | None, tensors: dict[str, Any]) -> Any:
        """The head's own embedding, else the target's when its shape fits the head."""
        from torch import nn

        if name is not None:
            return nn.Embedding.from_pretrained(tensors[name], freeze=True)
        emb = self.target.model.get_input_embeddings()
        if int(emb.weight.shape[-1]) != self.layout.hidden_size:
            raise ModelLoadError(
                f"{self.layout.path}: the head has no embed_tokens and cannot share the target's ({list(emb.weight.shape)} vs hidden {self.layout.hidden_size})",
                "export the head with its embedding, or use a head built for this target",
            )
        return emb

    def _rotary(self, cfg: dict[str, Any]) -> Any:
        # deferred: loads torch, which the torch-free commands that import this module never need
        from specprobe.models.heads.layers import Rotary, llama_config

        return Rotary(llama_config(cfg, hidden_size=self.layout.hidden_size)).to(self.target.device)


class Eagle3Drafter(_EagleBase):
    """EAGLE-3 head over a loaded target (layout from `describe_eagle3`)."""

    def __init__(self, spec: str, target: Any, info: Any, layout: HeadLayout) -> None:
        super().__init__(spec, target, info, layout)
        self.aux = scored_aux_layers(layout, target.num_layers)

    def _build(self) -> None:
        import torch

        # deferred: loads torch, which the torch-free commands that import this module never need
        from specprobe.models.heads.layers import Eagle3Head

        target, layout = self.target, self.layout
        d, h = layout.details, layout.hidden_size
        pre, root, where = d["prefix"], d["root"], str(layout.path)
        names = [n for n in layout.files.tensors if n.startswith(pre)] + [root + "fc.weight", root + "norm.weight"]
        names += [n for n in (root + "fc.bias", d["lm_head"], d["d2t"], d["embed"]) if n and layout.files.has(n)]
        t = layout.files.load(names, device=target.device, dtype=target.dtype)
        fc = t[root + "fc.weight"]
        if fc.shape[1] != len(self.aux) * target.config.hidden_size:
            raise ModelLoadError(
                f"{where}: fc reads {fc.shape[1]} features but {len(self.aux)} target states of {target.config.hidden_size} give {len(self.aux) * target.config.hidden_size}",
                "this head was trained for another target (see `specprobe check`)",
            )
        if d["lm_head"] is None:
            raise ModelLoadError(f"{where}: the EAGLE-3 head has no lm_head.weight", "the checkpoint is incomplete")
        lm = t[d["lm_head"]]
        self.head = Eagle3Head(
            d["layer_config"], h, int(fc.shape[1]), int(lm.shape[0]),
            norm_before_residual=bool(d["norm_before_residual"]), qk_norm=layout.files.has(pre + "self_attn.q_norm.weight"), fc_bias=root + "fc.bias" in t,
        )
        _load(self.head.fc, t, root + "fc.", where)
        _load(self.head.layer, t, pre, where)
        _load(self.head.norm, t, root + "norm.", where)
        self.head.lm_head.weight.data = lm
        self.head.to(device=target.device, dtype=target.dtype).eval()
        self.embed = self._embedding(d["embed"], t)
        vd, v = int(lm.shape[0]), self.vocab
        # vLLM reads draft id i as target id i + d2t[i]; offsets stay 0 without d2t
        ids = target_ids(t.get(d["d2t"]) if d["d2t"] else None, vd)
        self.ids = None if vd == v and bool((ids == torch.arange(v)).all()) else ids
        self._count(self.head)

    def target_layers_needed(self) -> tuple[int, ...]:
        return tuple(sorted({k for k in self.aux if k >= 1}))

    def features(self, tp: Any) -> ChainedFeatures:
        import torch

        states = [tp.layer_hidden[k] if k >= 1 else self.target.model.get_input_embeddings()(tp.input_ids) for k in self.aux]
        first = self.head.fc(torch.cat(states, dim=-1).to(self.head.fc.weight.dtype))  # [B, S, H]
        cache: list[Any] = []
        ids = tp.input_ids
        return ChainedFeatures(lambda j, h: self.head.step(self.embed(shifted_tokens(ids, j)).to(h.dtype), h, j, cache), first, MAX_CHAIN)

    def head_logits(self, features: Any, depth: int) -> Any:
        return self.head.lm_head(features.to(self.head.lm_head.weight.dtype))


class Eagle1Drafter(_EagleBase):
    """EAGLE-1/2 head: fc([embed; hidden]) -> L Llama layers (the first without its input
    norm) -> the target's own LM head; the first hidden is the target's final (normed) state."""

    def _build(self) -> None:
        from torch import nn

        # deferred: loads torch, which the torch-free commands that import this module never need
        from specprobe.models.heads.layers import DecoderLayer

        target, layout = self.target, self.layout
        d, h = layout.details, layout.hidden_size
        cfg, root = d["layer_config"], d["root"]
        names = [n for n in layout.files.tensors if n.startswith(root + "layers.") or n.startswith(root + "fc.")]
        names += [d["embed"]] if d["embed"] else []
        t = layout.files.load(names, device=target.device, dtype=target.dtype)
        fc = t[root + "fc.weight"]
        self.fc = nn.Linear(fc.shape[1], fc.shape[0], bias=d["fc_bias"])
        _load(self.fc, t, root + "fc.", str(layout.path))
        if fc.shape[1] != 2 * target.config.hidden_size:
            raise ModelLoadError(f"{layout.path}: fc reads {fc.shape[1]} features, not 2 × the target's hidden size {target.config.hidden_size}", "this head was trained for another target (see `specprobe check`)")
        qk = layout.files.has(root + "layers.0.self_attn.q_norm.weight")
        self.layers = [DecoderLayer(cfg, h, h, input_norm=i > 0, hidden_norm=False, qk_norm=qk) for i in range(d["num_layers"])]
        for i, lay in enumerate(self.layers):
            _load(lay, t, f"{root}layers.{i}.", str(layout.path))
        self.embed = self._embedding(d["embed"], t)
        self.rotary = self._rotary(cfg)
        for m in (self.fc, *self.layers):
            m.to(device=target.device, dtype=target.dtype).eval()
        self._count(self.fc, *self.layers)

    def _step(self, ids: Any, caches: list[list[Any]], j: int, hidden: Any) -> tuple[Any, Any]:
        import torch

        b, s = ids.shape
        e = self.embed(shifted_tokens(ids, j)).to(hidden.dtype)
        x = self.step_at(e, hidden, positions(b, s, j, e.device), chain_mask(s, j, torch.float32, e.device), caches)
        return x, x

    def step_at(self, e: Any, hidden: Any, pos: Any, mask: Any, caches: list[Any]) -> Any:
        """fc([embedding; hidden]) through the layers at position ids pos [B, S] under an
        additive mask; -> the output (the next step's hidden and the LM head's input)."""
        import torch

        x = self.fc(torch.cat([e, hidden], dim=-1))
        cos, sin = self.rotary(x, pos)
        for lay, cache in zip(self.layers, caches, strict=True):
            a = lay.input_layernorm(x) if lay.input_layernorm is not None else x
            x = x + lay.self_attn(a, cos, sin, mask, cache)
            x = x + lay.mlp(lay.post_attention_layernorm(x))
        return x

    def features(self, tp: Any) -> ChainedFeatures:
        caches: list[list[Any]] = [[] for _ in self.layers]
        return ChainedFeatures(lambda j, h: self._step(tp.input_ids, caches, j, h), tp.last_hidden, MAX_CHAIN)

    def head_logits(self, features: Any, depth: int) -> Any:
        return self.target.head(features)
