"""The small torch modules EAGLE heads are made of: Llama-style attention over a growing
list of cached keys/values (so the chained-draft mask of `chain` can be applied), the
gated MLP, and rotary embeddings. Written here rather than borrowed from a transformers
decoder layer because EAGLE's first layer reads [embedding; hidden] (2·H inputs) and
keeps its own norms; the maths is transformers' Llama attention, line for line.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specprobe.models.heads.chain import chain_mask, positions


class RMSNorm(nn.Module):
    """x / rms(x) · w (computed in float32, as transformers does); `offset` 1 gives
    Qwen3-Next's x / rms(x) · (1 + w)."""

    def __init__(self, size: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (h * (self.offset + self.weight.float())).to(dtype)
        return self.weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    """Grouped-query attention whose q/k/v read `in_dim` inputs; optional per-head q/k
    RMSNorm (Qwen3). `cache` is this layer's list of (k, v) per call: each call appends
    its own and attends over all of them under the given additive mask."""

    def __init__(self, hidden: int, in_dim: int, heads: int, kv_heads: int, head_dim: int, bias: bool, qk_norm: bool, eps: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(in_dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, heads, S, D]
        c, sn = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)
        q = q * c + _rotate_half(q) * sn
        k = k * c + _rotate_half(k) * sn
        cache.append((k, v))
        if len(cache) == 1:  # one entry (the live loop's KVList): read it in place, no copy
            keys, vals = cache[0]
        else:
            keys = torch.cat([kk for kk, _ in cache], dim=2)
            vals = torch.cat([vv for _, vv in cache], dim=2)
        rep = self.heads // self.kv_heads
        if rep > 1:
            keys, vals = keys.repeat_interleave(rep, dim=1), vals.repeat_interleave(rep, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, attn_mask=mask.to(q.dtype))
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str, bias: bool = False) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One EAGLE layer's modules from its Llama-style config dict. EAGLE-3: attention reads
    `in_dim` = 2·H and the layer has input_layernorm + hidden_norm; EAGLE-1: the first
    layer has no input_layernorm (None)."""

    def __init__(self, cfg: dict[str, Any], hidden: int, in_dim: int, *, input_norm: bool, hidden_norm: bool, qk_norm: bool) -> None:
        super().__init__()
        heads = int(cfg.get("num_attention_heads") or 1)
        kv = int(cfg.get("num_key_value_heads") or heads)
        hd = int(cfg.get("head_dim") or hidden // heads)
        eps = float(cfg.get("rms_norm_eps") or 1e-6)
        self.self_attn = Attention(hidden, in_dim, heads, kv, hd, bool(cfg.get("attention_bias", False)), qk_norm, eps)
        self.mlp = MLP(hidden, int(cfg.get("intermediate_size") or 4 * hidden), str(cfg.get("hidden_act") or "silu"), bool(cfg.get("mlp_bias", False)))
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.input_layernorm = RMSNorm(hidden, eps) if input_norm else None
        self.hidden_norm = RMSNorm(hidden, eps) if hidden_norm else None


class Eagle3Head(nn.Module):
    """EAGLE-3's modules and one chained step, shared by scoring and training (so a head
    trained here is run exactly as it is scored).

    step: [input_layernorm(embed); hidden_norm(hidden)] (2·H) -> attention; residual =
    the raw hidden (or its hidden_norm with norm_before_residual); + MLP. Returns the
    pre-norm output (the next step's hidden) and norm(output) (the LM head's input)."""

    def __init__(self, cfg: dict[str, Any], hidden: int, fc_in: int, draft_vocab: int, *, norm_before_residual: bool, qk_norm: bool = False, fc_bias: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(fc_in, hidden, bias=fc_bias)
        self.layer = DecoderLayer(cfg, hidden, 2 * hidden, input_norm=True, hidden_norm=True, qk_norm=qk_norm)
        self.norm = RMSNorm(hidden, float(cfg.get("rms_norm_eps") or 1e-6))
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        self.rotary = Rotary(llama_config(cfg, hidden_size=hidden))
        self.norm_before_residual = norm_before_residual

    def step(self, embeds: torch.Tensor, hidden: torch.Tensor, step: int, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """embeds [B, S, H] of the tokens fed on this step, hidden [B, S, H] from the last
        one (fc(aux) on step 0); `cache` holds this chain's earlier keys/values."""
        b, s, _ = embeds.shape
        return self.step_at(embeds, hidden, positions(b, s, step, embeds.device), chain_mask(s, step, torch.float32, embeds.device), cache)

    def step_at(self, embeds: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One step at explicit position ids [B, S] under an additive mask [B|1, 1, S, L+S]
        (the live draft loop's slots, which may be holes) -> (next hidden, normed output)."""
        cos, sin = self.rotary(embeds, pos)
        lay = self.layer
        assert lay.input_layernorm is not None and lay.hidden_norm is not None  # built with both
        en = lay.input_layernorm(embeds)
        if self.norm_before_residual:
            hn = lay.hidden_norm(hidden)
            residual = hn
        else:
            residual, hn = hidden, lay.hidden_norm(hidden)
        x = residual + lay.self_attn(torch.cat([en, hn], dim=-1), cos, sin, mask, cache)
        x = x + lay.mlp(lay.post_attention_layernorm(x))
        return x, self.norm(x)


class MTPLayer(nn.Module):
    """One MTP layer: enorm/hnorm, a projection of their concatenation, the target's own
    decoder block, out_norm (shared_head.norm / final_layernorm / mtp.norm)."""

    def __init__(self, hidden: int, eps: float, offset: float, block: nn.Module) -> None:
        super().__init__()
        self.enorm = RMSNorm(hidden, eps, offset)
        self.hnorm = RMSNorm(hidden, eps, offset)
        self.out_norm = RMSNorm(hidden, eps, offset)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = block


def llama_config(cfg: dict[str, Any], **override: Any) -> Any:
    """A transformers LlamaConfig from a head's layer config dict (rope settings kept)."""
    from transformers import LlamaConfig

    keep = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "auto_map", "torch_dtype", "dtype", "transformers_version")}
    keep.update(override)
    return LlamaConfig(**keep)


class Rotary(nn.Module):
    """cos/sin [B, S, D] for position ids, from transformers' Llama rotary embedding (so
    rope_theta and rope scaling mean what they mean for the model the head was built on)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.rope = LlamaRotaryEmbedding(config=config)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rope(x, position_ids)
        return cos, sin
