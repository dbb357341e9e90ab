"""A tiny llama GGUF written with the `gguf` package's GGUFWriter: 2 layers, hidden 64,
4 query heads over 2 KV heads (so the Q/K row permutation of llama.cpp's converter is
exercised on both), a byte-level gpt2 tokenizer of 256 byte tokens, a few merges and
three specials, and a separate LM head (`output.weight`). Random weights, made peaked so
logits differ clearly between positions. The linear weights are written in `linear_type`
(F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: what `gguf.quants.quantize` writes); norms stay
F32; the embeddings and the LM head in `embed_type`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "o Ġ", "Ġ w", "he ll"]


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = [], 0
    table = {}
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    chars = [table[b] for b in range(256)]
    return chars


def tokens() -> list[str]:
    return SPECIALS + _byte_alphabet() + [m.replace(" ", "") for m in MERGES]


def write_tiny_gguf(path: Path, linear_type: str = "Q8_0", embed_type: str = "Q8_0", seed: int = 0, tied: bool = False) -> Path:
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    toks = tokens()
    vocab = len(toks)
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def mat(rows: int, cols: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("tiny-llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type({"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9}[linear_type])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([3] * len(SPECIALS) + [1] * (vocab - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_start|>{% endif %}")

    def add(name: str, x: np.ndarray, qtype: str) -> None:
        t = Q[qtype]
        data = quantize(x, t)
        w.add_tensor(name, data, raw_dtype=t)

    add("token_embd.weight", mat(vocab, HIDDEN, 1.0), embed_type)
    add("output_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), "F32")
    if not tied:
        add("output.weight", mat(vocab, HIDDEN, 1.5), embed_type)
    for i in range(LAYERS):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), "F32")
        add(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), "F32")
        add(p + "attn_q.weight", mat(HIDDEN, HIDDEN), linear_type)
        add(p + "attn_k.weight", mat(KV_HEADS * head_dim, HIDDEN), linear_type)
        add(p + "attn_v.weight", mat(KV_HEADS * head_dim, HIDDEN), linear_type)
        add(p + "attn_output.weight", mat(HIDDEN, HIDDEN), linear_type)
        add(p + "ffn_gate.weight", mat(FFN, HIDDEN), linear_type)
        add(p + "ffn_up.weight", mat(FFN, HIDDEN), linear_type)
        add(p + "ffn_down.weight", mat(HIDDEN, FFN), linear_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def rewrite_gguf(reader: Any, dst: Path, tensors: Sequence[tuple[str, np.ndarray, Any]], values: Mapping[str, int]) -> Path:
    """Write a GGUF at `dst` with `reader`'s metadata (a field named in `values` takes
    that value instead, added as uint32 where the source has none) and `tensors`
    ((name, data, ggml type), in that order). Written to a sibling and renamed into place,
    so a half-written file never remains next to the destination."""
    import gguf

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".part")
    try:
        writer = gguf.GGUFWriter(str(tmp), arch=reader.fields["general.architecture"].contents())
        for field in reader.fields.values():
            if field.name == "general.architecture" or field.name.startswith("GGUF."):
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, values.get(field.name, field.contents()), vtype, sub_type=sub)
        for name, value in values.items():
            if name not in reader.fields:
                writer.add_uint32(name, value)
        for name, data, qtype in tensors:
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, data, _ in tensors:
            writer.write_tensor_data(data)
        writer.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(dst)
    return dst
