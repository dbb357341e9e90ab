"""A target's own multi-token-prediction (MTP) layers, in the three layouts checkpoints use.

DeepSeek-V3/R1, GLM-4.5 (`num_nextn_predict_layers`; vLLM `deepseek_mtp.py`): layer k at
`model.layers.{L+k}.` with enorm, hnorm, eh_proj [H, 2H], a decoder block of the
target's own kind, shared_head.norm and shared_head.head (+ an optional embed_tokens).
  x = eh_proj([enorm(embed(tok)); hnorm(h)]); x = block(x); logits = head(norm(x));
  the pre-norm x is the next step's h.
Qwen3-Next (`qwen3_next_mtp.py`): `mtp.fc` [H, 2H], `mtp.pre_fc_norm_embedding`,
`mtp.pre_fc_norm_hidden`, `mtp.layers.{k}.*` (full attention), `mtp.norm`; the normed
output is both the head input (the target's LM head) and the next h. Its norms are
x·(1 + w).
MiMo (`mimo_mtp.py`): `model.mtp_layers.{k}.` with token_layernorm, hidden_layernorm,
input_proj over **[hidden; embed]**, a Qwen2 block, final_layernorm; target LM head.

vLLM feeds step j the layer j mod n, starting from the target's final normed hidden
state, and zeroes the embedding at position 0 (DeepSeek, MiMo).
"""

from __future__ import annotations

import copy
import inspect
import re
from typing import Any

from specprobe.core.errors import ModelLoadError
from specprobe.models.anatomy import base_model, decoder_layers
from specprobe.models.heads import chain
from specprobe.models.heads.files import HeadFiles
from specprobe.models.heads.layout import HeadLayout

# role -> tensor suffix, per layout
_ROLES = {
    "deepseek": {"enorm": "enorm.weight", "hnorm": "hnorm.weight", "proj": "eh_proj.weight", "out_norm": "shared_head.norm.weight"},
    "qwen3_next": {"enorm": "pre_fc_norm_embedding.weight", "hnorm": "pre_fc_norm_hidden.weight", "proj": "fc.weight", "out_norm": "norm.weight"},
    "mimo": {"enorm": "token_layernorm.weight", "hnorm": "hidden_layernorm.weight", "proj": "input_proj.weight", "out_norm": "final_layernorm.weight"},
}
_SPECIAL = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.", "token_layernorm.", "hidden_layernorm.", "input_proj.", "final_layernorm.")


def describe_mtp(files: HeadFiles) -> HeadLayout | None:
    """The MTP layers of a target checkpoint folder (config + headers), or None when its
    config declares none and its files hold none."""
    cfg = files.config
    L = int(cfg.get("num_hidden_layers") or 0)
    hidden = int(cfg.get("hidden_size") or 0)
    vocab = int(cfg.get("vocab_size") or 0)
    declared = cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers")
    mtp_layers = sorted({int(m.group(1)) for n in files.tensors if (m := re.match(r"mtp\.layers\.(\d+)\.", n))})
    mimo_layers = sorted({int(m.group(1)) for n in files.tensors if (m := re.match(r"model\.mtp_layers\.(\d+)\.", n))})
    if files.has("mtp.fc.weight") or mtp_layers or str(cfg.get("model_type")) == "qwen3_next":
        style, n_found = "qwen3_next", len(mtp_layers)
    elif mimo_layers or str(cfg.get("model_type")) == "mimo":
        style, n_found = "mimo", len(mimo_layers)
    else:
        style = "deepseek"
        n_found = len({int(m.group(1)) for n in files.tensors if (m := re.match(r"model\.layers\.(\d+)\.", n)) and int(m.group(1)) >= L})
    n = int(declared) if isinstance(declared, int) and declared > 0 else n_found
    if n <= 0:
        return None
    prefixes = [layer_prefix(style, k, L) for k in range(n)]
    roles = _ROLES[style]
    # Qwen3-Next keeps fc and its norms once, under mtp.; the others per layer
    role_pre = ["mtp." if style == "qwen3_next" else p for p in prefixes]
    missing = {k: [rp + s for s in roles.values() if not files.has(rp + s)] + [p + "input_layernorm.weight"] * (not files.has(p + "input_layernorm.weight")) for k, (p, rp) in enumerate(zip(prefixes, role_pre, strict=True))}
    details = {
        "format": style,
        "num_layers": n,
        "declared": declared,
        "target_layers": L,
        "prefixes": prefixes,
        "missing": {k: v for k, v in missing.items() if v},
        "proj_shapes": {k: files.shape(rp + roles["proj"]) for k, rp in enumerate(role_pre)},
        "own_head": [files.has(p + "shared_head.head.weight") for p in prefixes] if style == "deepseek" else [False] * n,
        "own_embed": [files.has(p + "embed_tokens.weight") for p in prefixes] if style == "deepseek" else [False] * n,
        # MiMo concatenates [hidden; embed], the others [embed; hidden]
        "hidden_first": style == "mimo",
    }
    label = {"deepseek": "MTP (DeepSeek-V3 / GLM-4.5 layout)", "qwen3_next": "MTP (Qwen3-Next layout)", "mimo": "MTP (MiMo layout)"}[style]
    return HeadLayout("mtp", label, files, hidden, vocab, vocab, n, details)


def layer_prefix(style: str, k: int, num_target_layers: int) -> str:
    if style == "qwen3_next":
        return f"mtp.layers.{k}."
    if style == "mimo":
        return f"model.mtp_layers.{k}."
    return f"model.layers.{num_target_layers + k}."


def _block_kwargs(layer: Any) -> str:
    params = inspect.signature(type(layer).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class MTPDrafter(chain.HeadDrafter):
    """The target's MTP layers, chained (layer j mod n at step j)."""

    def _build(self) -> None:
        from torch import nn

        # deferred: loads torch, which the torch-free commands that import this module never need
        from specprobe.models.heads.layers import MTPLayer

        target, layout = self.target, self.layout
        d = layout.details
        if d["missing"]:
            k, names = next(iter(d["missing"].items()))
            raise ModelLoadError(f"{layout.path}: MTP layer {k} has no {names[0]} ({len(names)} tensors missing)", "the checkpoint was saved without its MTP weights (transformers drops them); use the original release files")
        self.style = d["format"]
        roles = _ROLES[self.style]
        cfg = target.config
        eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        offset = 1.0 if self.style == "qwen3_next" else 0.0
        layers, _ = decoder_layers(target.model)
        block_cls = type(layers[0])
        self.rotary = base_model(target.model).rotary_emb
        self.mods = nn.ModuleList()
        self.own_heads: list[Any] = []
        self.own_embed: Any = None
        top = "mtp." if self.style == "qwen3_next" else ""
        for k, pre in enumerate(d["prefixes"]):
            names = [n for n in layout.files.tensors if n.startswith(pre)]
            if self.style == "qwen3_next":
                names += [top + r for r in roles.values() if r != "proj" and layout.files.has(top + r)] + [top + roles["proj"]]
            t = layout.files.load(sorted(set(names)), device=target.device, dtype=target.dtype)
            src = top if self.style == "qwen3_next" else pre
            h = int(cfg.hidden_size)
            w = t[src + roles["proj"]]
            if tuple(w.shape) != (h, 2 * h):
                raise ModelLoadError(f"{layout.path}: {src + roles['proj']} has shape {list(w.shape)}, expected [{h}, {2 * h}]", "these MTP weights do not belong to this target")
            m = MTPLayer(h, eps, offset, self._block(block_cls, cfg, pre, t, int(d["target_layers"]) + k))
            for role in ("enorm", "hnorm", "out_norm"):
                getattr(m, role).weight.data = t[src + roles[role]]
            m.proj.weight.data = w
            m.to(device=target.device, dtype=target.dtype).eval()
            self.mods.append(m)
            head = t.get(pre + "shared_head.head.weight")
            if head is not None:
                lin = nn.Linear(head.shape[1], head.shape[0], bias=False)
                lin.weight.data = head
                head = lin.to(device=target.device, dtype=target.dtype).eval()
            self.own_heads.append(head)
            if k == 0 and pre + "embed_tokens.weight" in t:  # vLLM loads the first layer's only
                self.own_embed = nn.Embedding.from_pretrained(t[pre + "embed_tokens.weight"], freeze=True)
        self._count(self.mods, *[hd for hd in self.own_heads if hd is not None])

    def _block(self, block_cls: Any, cfg: Any, pre: str, t: dict[str, Any], layer_idx: int) -> Any:
        """The target's own decoder-layer class, filled with this MTP layer's block weights."""
        cfg = copy.deepcopy(cfg)
        types = getattr(cfg, "layer_types", None)
        if isinstance(types, list) and len(types) <= layer_idx:
            # MTP blocks use full attention (Qwen3-Next's hybrid stack names linear ones)
            cfg.layer_types = types + ["full_attention"] * (layer_idx + 1 - len(types))
        try:
            block = block_cls(cfg, layer_idx)
        except Exception as e:
            raise ModelLoadError(f"cannot build an MTP block of {block_cls.__name__}: {str(e).splitlines()[0][:120]}", "this architecture's MTP layers are not supported") from e
        sd = {n[len(pre) :]: v for n, v in t.items() if n.startswith(pre) and not n[len(pre) :].startswith(_SPECIAL)}
        try:
            missing, unexpected = block.load_state_dict(sd, strict=False)
        except RuntimeError as e:  # size mismatches
            raise ModelLoadError(f"MTP block {pre}: {str(e).splitlines()[-1].strip()[:160]}", "these MTP weights do not match the target's decoder layer") from e
        if missing or unexpected:
            which = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
            raise ModelLoadError(f"MTP block {pre}: {which} ({len(missing)} missing, {len(unexpected)} unexpected)", "these MTP weights do not match the target's decoder layer")
        block.requires_grad_(False)
        return block

    def _embed(self, ids: Any) -> Any:
        emb = self.own_embed if self.own_embed is not None else self.target.model.get_input_embeddings()
        return emb(ids.to(emb.weight.device))

    def _step(self, ids: Any, caches: list[Any], uses: list[int], j: int, hidden: Any) -> tuple[Any, Any]:
        k = j % len(self.mods)
        b, s = ids.shape
        e = self._embed(chain.shifted_tokens(ids, j)).to(hidden.dtype)
        if j == 0 and self.style in ("deepseek", "mimo"):
            e = e.clone()
            e[:, 0] = 0  # vLLM masks the embedding at position 0
        pos = chain.positions(b, s, j, e.device)
        mask = chain.chain_mask(s, uses[k], e.dtype, e.device).expand(b, -1, -1, -1)
        uses[k] += 1
        return self.step_at(k, e, hidden, pos, mask, caches[k])

    def step_at(self, k: int, e: Any, hidden: Any, pos: Any, mask: Any, cache: Any) -> tuple[Any, Any]:
        """MTP layer k on embeddings e and hidden [B, S, H] at position ids pos under an
        additive mask [B, 1, S, L+S] -> (the next step's hidden, the LM head's input)."""
        import torch

        m: Any = self.mods[k]
        en, hn = m.enorm(e), m.hnorm(hidden)
        x = m.proj(torch.cat([hn, en] if self.style == "mimo" else [en, hn], dim=-1))
        out = m.block(x, attention_mask=mask.to(x.dtype), position_ids=pos, position_embeddings=self.rotary(x, pos), use_cache=True, **{_block_kwargs(m.block): cache})
        x = out[0] if isinstance(out, tuple) else out
        normed = m.out_norm(x)
        # DeepSeek chains the pre-norm output; Qwen3-Next and MiMo return (and chain) the normed one
        return (x if self.style == "deepseek" else normed), normed

    def features(self, tp: Any) -> chain.ChainedFeatures:
        from transformers import DynamicCache

        caches = [DynamicCache() for _ in self.mods]
        uses = [0] * len(self.mods)
        return chain.ChainedFeatures(lambda j, h: self._step(tp.input_ids, caches, uses, j, h), tp.last_hidden, chain.MAX_CHAIN)

    def head_logits(self, features: Any, depth: int) -> Any:
        head = self.own_heads[(depth - 1) % len(self.mods)]
        return self.target.head(features) if head is None else head(features.to(head.weight.dtype))
