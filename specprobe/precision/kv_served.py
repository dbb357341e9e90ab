"""The KV cache as an engine stores it, simulated in the attention a model's decoder layers
run: vLLM's fp8 (e4m3, `quant.fp8_kv_cache`) and llama.cpp's ggml types (llama-server's
--cache-type-k / --cache-type-v: f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1; `ggml_blocks`).

For a ggml type each head's K and V vectors are rounded block by block as ggml writes them
to the cache, and the query as ggml's K·Q dot product converts it for that K type (f16 for
f16, 8-bit blocks for the quantized types). A quantized type is stored rotated, as
llama.cpp's KV cache stores it (head size a multiple of 64): Q and K multiplied by an
orthonormal Hadamard matrix before K is rounded, V before it is rounded and the
attention's output by it again after. A llama-family model's Q and K are rounded in the
element order llama.cpp holds them (its GGUF converter permutes q_proj/k_proj). llama.cpp writes the batch's own K/V to the
cache before its attention reads them, so the prompt's keys are rounded too, as the
current tokens' are in vLLM. Not modelled: the CPU flash-attention kernel's f16
accumulator of V·softmax for an f16 V cache, and q8_1's stored block sum (q4_1/q5_1 K).
"""

from __future__ import annotations

from typing import Any

import torch

from specprobe.precision import ggml_blocks

# transformers model types whose q_proj/k_proj llama.cpp's converter permutes (its LLAMA
# rope runs on adjacent pairs; transformers' GGUF loader undoes the permutation): their
# Q/K are rounded in llama.cpp's element order. Rotate-half archs (qwen2, qwen3, gemma,
# phi3 — NEOX rope in llama.cpp) are stored in transformers' order.
GGUF_PERMUTED = frozenset({"llama", "mistral", "mixtral", "granite", "granitemoe"})


def kv_types(dtype: str) -> tuple[str, str]:
    """--kv-cache-dtype's value as (K type, V type): "q8_0" → (q8_0, q8_0), "q8_0/f16" →
    (q8_0, f16) (llama-server's -ctk and -ctv apart), "fp8" → (fp8, fp8)."""
    k, _, v = dtype.partition("/")
    return k, v or k


def ggml_kv_cache(model: Any, dtype: str) -> str:
    """Round Q, K and V as a llama.cpp `dtype` cache (a ggml type or K/V pair) makes the
    attention of `model`'s decoder layers see them, by a registered attention
    implementation wrapping the model's own (sdpa, eager, …) with its mask; only this
    model's config switches to it. Returns the implementation's name."""
    from specprobe.core.errors import ModelLoadError
    from specprobe.precision.quant import _attention_modules, _inner_attention, _use_attention

    attn = _attention_modules(model)
    if not attn:
        raise ModelLoadError(f"{type(model).__name__}: no decoder attention with k_proj/v_proj found", f"--kv-cache-dtype {dtype} supports transformers decoder models (Llama, Qwen, Mistral, SmolLM2, …)")
    base = model.config._attn_implementation or "eager"
    if base.startswith("specprobe_kv"):
        return base
    k_type, v_type = kv_types(dtype)
    for t in (k_type, v_type):
        if t not in ggml_blocks.TYPES:
            raise ModelLoadError(f"--kv-cache-dtype {dtype}: {t!r} is not a KV-cache type specprobe simulates", f"use fp8 or one of llama.cpp's {', '.join(ggml_blocks.TYPES)}")
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for side, t in (("K", k_type), ("V", v_type)):
        block = ggml_blocks.block_of(t)
        if head_dim % block:  # llama.cpp's context refuses it the same way
            raise ModelLoadError(f"--kv-cache-dtype {dtype}: the {side} cache type {t} has blocks of {block}, which do not divide the head size {head_dim}", "llama.cpp refuses this cache type for this model too: use f16 or bf16")
    module, inner = _inner_attention(model, attn, base)
    name = f"specprobe_kv_{k_type}_{v_type}_{base}_{module}".replace(".", "_")
    q_type = ggml_blocks.query_type(k_type)
    rnd, rot = ggml_blocks.ggml_round, ggml_blocks.rotate
    nk, nv = ggml_blocks.rotation_orders(k_type, v_type, head_dim)
    permuted = getattr(cfg, "model_type", None) in GGUF_PERMUTED

    def cached(mod: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # [B, H, S, head_dim]: ggml's blocks (and rotations) run along each head's vector,
        # in llama.cpp's element order (Q and K alike, so Q·K needs no way back)
        if permuted:
            query, key = ggml_blocks.gguf_order(query), ggml_blocks.gguf_order(key)
        if nk:
            query, key = rot(query, nk), rot(key, nk)
        if nv:
            value = rot(value, nv)
        out = inner(mod, rnd(query, q_type), rnd(key, k_type), rnd(value, v_type), *args, **kwargs)
        if not nv:
            return out
        attn, *rest = out if isinstance(out, tuple) else (out,)
        attn = rot(attn, nv)  # [B, S, H, head_dim] or [B, H, S, head_dim]: the last is the head's
        return (attn, *rest) if isinstance(out, tuple) else attn

    return _use_attention(model, name, base, cached)


def serve_kv_cache(loaded: Any, dtype: str) -> None:
    """A loaded model's KV cache served as `dtype` (fp8, or a ggml type / K/V pair), noted on
    `loaded.kv_cache_dtype`; `quant.as_loaded` restores the model's own attention."""
    from specprobe.precision.quant import serve_fp8_kv

    if dtype == "fp8":
        serve_fp8_kv(loaded)
        return
    loaded.attn_as_loaded = loaded.model.config._attn_implementation
    ggml_kv_cache(loaded.model, dtype)
    loaded.kv_cache_dtype = dtype
    loaded._head = None
