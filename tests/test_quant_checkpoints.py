"""Quantized checkpoints from disk (specprobe.precision.quant_checkpoint): tiny checkpoints
written from each format's specification — compressed-tensors pack-quantized (int4
symmetric and asymmetric with activation-ordered groups, int8 per channel) and
int-quantized, GPTQ v1 / v2 (4-, 3- and 8-bit, desc_act), AWQ GEMM — with the fields the
real files carry, packed here bit by bit the way each format's packer lays them out, and
read back to exactly the closed form (q − z) · s of the integers written. Formats specprobe
does not read are refused in one line before any model is built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from specprobe.core.errors import ModelLoadError
from specprobe.precision import qlinear, quant
from specprobe.precision.quant_checkpoint import AWQ_ORDER, unpack_bits
from tests.helpers.tiny import tiny_llama as _tiny_llama

GROUP = 16



def _word(values: list[int], bits: int) -> int:
    """One int32 word holding `values` (unsigned, < 2^bits), the first in the low bits, as
    a signed 32-bit number (safetensors stores int32)."""
    w = 0
    for k, v in enumerate(values):
        assert 0 <= v < 1 << bits
        w |= v << (bits * k)
    return w - (1 << 32) if w >= 1 << 31 else w


def _stream(values: list[int], bits: int, words: int) -> list[int]:
    """`values` as one little-endian bit stream cut into int32 words (GPTQ's 3-bit)."""
    acc = sum(v << (bits * e) for e, v in enumerate(values))
    out = [(acc >> (32 * i)) & 0xFFFFFFFF for i in range(words)]
    return [w - (1 << 32) if w >= 1 << 31 else w for w in out]


def _write(src: Any, folder: Path, state: dict[str, torch.Tensor], qc: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    src.save_pretrained(folder, safe_serialization=True)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = qc
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _load(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The checkpoint dequantized at load (the reference), after checking that the model
    holding it quantized in memory is the same model (weights and logits bit for bit)."""
    from transformers import AutoConfig

    from tests.helpers.quantized import same_as_reference

    cfg = AutoConfig.from_pretrained(folder)
    ref, record = quant.load_quantized_checkpoint(folder, cfg, torch.float32, in_memory=False)
    held, held_record = quant.load_quantized_checkpoint(folder, cfg, torch.float32)
    assert same_as_reference(held, ref) == record["layers"]
    assert held_record["weights"] == record["weights"] and "held as stored" in held_record["note"]
    return ref.state_dict(), record


def _linears(src: Any) -> list[tuple[str, int, int]]:
    return [(f"model.{name}", mod.out_features, mod.in_features) for name, mod in qlinear.decoder_linears(src)]


def _plain(src: Any, quantized: set[str]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in src.state_dict().items() if k[: -len(".weight")] not in quantized}


def _check_rest(got: dict[str, torch.Tensor], src: Any, quantized: set[str]) -> None:
    for k, v in src.state_dict().items():
        if k[: -len(".weight")] not in quantized:
            assert torch.equal(got[k], v), k  # embeddings, norms, LM head as stored


def test_unpack_bits_closed_forms() -> None:
    w = torch.tensor([[_word([1, 2, 3, 4, 5, 6, 7, 8], 4)]], dtype=torch.int32)
    assert unpack_bits(w, 4, 8, dim=1).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert unpack_bits(torch.tensor([[_word([255, 0, 128, 7], 8)]], dtype=torch.int32), 8, 4, dim=1).tolist() == [[255, 0, 128, 7]]
    vals = [(5 * e + 3) % 8 for e in range(32)]  # 32 three-bit values straddle words 0/1 and 1/2
    words = torch.tensor(_stream(vals, 3, 3), dtype=torch.int32).reshape(3, 1)
    assert unpack_bits(words, 3, 32, dim=0)[:, 0].tolist() == vals


# ----------------------------------------------------------------------------- compressed-tensors
def _ct_qc(fmt: str, weights: dict[str, Any], acts: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed", "version": "0.12.2",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"type": "int", "dynamic": False, "observer": "minmax", "actorder": None, **weights}, "input_activations": acts, "output_activations": None}},
        "ignore": ["lm_head"], "kv_cache_scheme": None, "global_compression_ratio": None, "sparsity_config": {},
    }  # fmt: skip


@pytest.mark.parametrize("case", ["int4-sym-group", "int4-asym-actorder", "int8-channel", "int4-ragged"])
def test_compressed_tensors_pack_quantized(tmp_path: Path, case: str) -> None:
    """llm-compressor's W4A16 / W4A16_ASYM (actorder group) / W8A16 layouts: weight_packed
    int32 [out, in·b/32] with each signed q stored as q + 2^(b−1), sequential in each word;
    weight_shape; weight_scale [out, groups] or [out, 1]; asymmetric zero points packed
    down the output dimension; weight_g_idx for activation ordering."""
    bits = 8 if case == "int8-channel" else 4
    asym, actorder = case == "int4-asym-actorder", case == "int4-asym-actorder"
    src = _tiny_llama()
    g = torch.Generator().manual_seed(1)
    state = _plain(src, {p for p, _, _ in _linears(src)})
    want: dict[str, torch.Tensor] = {}
    lo, hi, pf = -(1 << (bits - 1)), (1 << (bits - 1)) - 1, 32 // bits
    for p, n_out, n_in in _linears(src):
        size = 24 if case == "int4-ragged" else GROUP  # 24: rows of 32 and 64 end in a shorter group (column c in group c // 24)
        groups = 1 if case == "int8-channel" else -(-n_in // size)
        q = torch.randint(lo, hi + 1, (n_out, n_in), generator=g)
        s = (torch.rand(n_out, groups, generator=g) * 0.1 + 0.01).to(torch.bfloat16)
        z = torch.randint(lo, hi + 1, (n_out, groups), generator=g) if asym else torch.zeros(n_out, groups, dtype=torch.long)
        g_idx = torch.randperm(n_in, generator=g) % groups if actorder else torch.arange(n_in) // (n_in if case == "int8-channel" else size)
        # the closed form, element by element through each column's group
        w = torch.empty(n_out, n_in)
        for c in range(n_in):
            w[:, c] = ((q[:, c] - z[:, g_idx[c]]).float() * s[:, g_idx[c]].float()).to(torch.bfloat16).float()
        want[p] = w
        u = (q - lo).tolist()  # unsigned, offset 2^(b-1)
        state[p + ".weight_packed"] = torch.tensor([[_word(row[j * pf : (j + 1) * pf], bits) for j in range(n_in // pf)] for row in u], dtype=torch.int32)
        state[p + ".weight_shape"] = torch.tensor([n_out, n_in], dtype=torch.int32)
        state[p + ".weight_scale"] = s
        if asym:
            zu = (z - lo).tolist()
            state[p + ".weight_zero_point"] = torch.tensor([[_word([zu[r][col] for r in range(i * pf, (i + 1) * pf)], bits) for col in range(groups)] for i in range(n_out // pf)], dtype=torch.int32)
        if actorder:
            state[p + ".weight_g_idx"] = g_idx.to(torch.int32)
    weights = {"num_bits": bits, "symmetric": not asym, "strategy": "channel" if case == "int8-channel" else "group", "group_size": None if case == "int8-channel" else 24 if case == "int4-ragged" else GROUP, "actorder": "group" if actorder else None}
    folder = _write(src, tmp_path / case, state, _ct_qc("pack-quantized", weights))
    got, record = _load(folder)
    for p, w in want.items():
        assert torch.equal(got[p + ".weight"], w), p
    _check_rest(got, src, set(want))
    assert (record["method"], record["weights"], record["layers"]) == ("checkpoint", f"int{bits}", 14)
    assert "compressed-tensors pack-quantized" in record["note"]


def test_compressed_tensors_int_quantized_w8a8(tmp_path: Path) -> None:
    """W8A8 (int-quantized): weight in int8 as it is, weight_scale [out, 1]; the dynamic
    per-token activation scheme in the config changes nothing stored."""
    src = _tiny_llama()
    g = torch.Generator().manual_seed(2)
    state = _plain(src, {p for p, _, _ in _linears(src)})
    want = {}
    for p, n_out, n_in in _linears(src):
        q = torch.randint(-128, 128, (n_out, n_in), generator=g, dtype=torch.int8)
        s = (torch.rand(n_out, 1, generator=g) * 0.01 + 1e-3).to(torch.bfloat16)
        state[p + ".weight"], state[p + ".weight_scale"] = q, s
        want[p] = (q.float() * s.float()).to(torch.bfloat16).float()
    acts = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    for layer in range(2):  # an fp8 kv_cache_scheme's scales: dropped (--kv-cache-dtype fp8 uses 1.0)
        state[f"model.layers.{layer}.self_attn.k_scale"], state[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(0.02), torch.tensor(0.03)
    qc = {**_ct_qc("int-quantized", {"num_bits": 8, "symmetric": True, "strategy": "channel"}, acts), "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}}
    folder = _write(src, tmp_path / "w8a8", state, qc)
    got, record = _load(folder)
    for p, w in want.items():
        assert torch.equal(got[p + ".weight"], w), p
    _check_rest(got, src, set(want))
    assert record["weights"] == "int8" and record["layers"] == 14
    # the activations: int8 per token, symmetric, scale amax / 127 (vLLM's W8A8 int8), the product in fp32
    assert record["activations"] == "int8 dynamic per token" and "input activations quantized" in record["note"]
    from transformers import AutoConfig

    held, _ = quant.load_quantized_checkpoint(folder, AutoConfig.from_pretrained(folder), torch.float32)
    mod = held.model.layers[0].mlp.down_proj
    x = torch.randn(3, 5, 64, generator=g)
    amax = x.abs().amax(dim=-1, keepdim=True)
    xq = torch.round(x * 127 / amax).clamp(-128, 127)
    assert int(xq.abs().amax(dim=-1).min()) == 127  # each token's largest activation maps to ±127
    with torch.no_grad():
        assert torch.allclose(mod(x), (xq * (amax / 127)) @ want["model.layers.0.mlp.down_proj"].t(), rtol=1e-5, atol=1e-6)


def test_compressed_tensors_fp8_block(tmp_path: Path) -> None:
    """llm-compressor's FP8_BLOCK: weight float8_e4m3fn with weight_scale [out/bh, in/bw]
    (one per 16 × 16 block here) and input activations dynamic per token in groups of 16."""
    src = _tiny_llama()
    g = torch.Generator().manual_seed(8)
    state = _plain(src, {p for p, _, _ in _linears(src)})
    want, b = {}, 16
    for p, n_out, n_in in _linears(src):
        q = (torch.randn(n_out, n_in, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        s = (torch.rand(n_out // b, n_in // b, generator=g) * 0.01 + 1e-3).to(torch.bfloat16)
        w = torch.empty(n_out, n_in)
        for i in range(n_out // b):
            for j in range(n_in // b):
                w[i * b : (i + 1) * b, j * b : (j + 1) * b] = (q[i * b : (i + 1) * b, j * b : (j + 1) * b].float() * s[i, j].float()).to(torch.bfloat16).float()
        state[p + ".weight"], state[p + ".weight_scale"], want[p] = q, s, w
    weights = {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [b, b], "symmetric": True, "dynamic": False}
    acts = {"num_bits": 8, "type": "float", "strategy": "group", "group_size": b, "symmetric": True, "dynamic": True}
    folder = _write(src, tmp_path / "fp8-block", state, _ct_qc("float-quantized", weights, acts))
    got, record = _load(folder)
    for p, w in want.items():
        assert torch.equal(got[p + ".weight"], w), p
    _check_rest(got, src, set(want))
    assert record["weights"] == "fp8" and record["activations"] == "fp8 dynamic per token in groups of 16"
    from transformers import AutoConfig

    held, _ = quant.load_quantized_checkpoint(folder, AutoConfig.from_pretrained(folder), torch.float32)
    x = torch.randn(2, 3, 32, generator=g)
    xg = x.reshape(2, 3, 2, b)
    scale = xg.abs().amax(dim=-1, keepdim=True) / 448  # each token's group of 16 columns its own scale
    xq = ((xg / scale).to(torch.float8_e4m3fn).float() * scale).reshape(2, 3, 32)
    with torch.no_grad():
        assert torch.allclose(held.model.layers[1].self_attn.k_proj(x), xq @ want["model.layers.1.self_attn.k_proj"].t(), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- GPTQ
@pytest.mark.parametrize(("bits", "fmt", "sym", "desc_act"), [(4, "gptq", True, False), (4, "gptq", False, True), (3, "gptq_v2", False, True), (8, "gptq", True, False)])
def test_gptq(tmp_path: Path, bits: int, fmt: str, sym: bool, desc_act: bool) -> None:
    """AutoGPTQ / GPTQModel: qweight int32 [in·b/32, out] (input rows packed, low bits
    first; 3-bit as a bit stream per 32 rows), qzeros [groups, out·b/32] (v1: zero − 1),
    scales fp16 [groups, out], g_idx [in] (desc_act: permuted groups). 3-bit streams come
    in blocks of 32 rows and columns: every layer 32 wide (4 KV heads)."""
    src = _tiny_llama(kv_heads=4 if bits == 3 else 2)
    g = torch.Generator().manual_seed(3 + bits)
    state = _plain(src, {p for p, _, _ in _linears(src)})
    want = {}
    top = (1 << bits) - 1
    for p, n_out, n_in in _linears(src):
        groups = n_in // GROUP
        q = torch.randint(0, top + 1, (n_in, n_out), generator=g)
        # symmetric: the zero is 2^(b-1); v1 stores it minus one, so a zero of 0 cannot be written
        z = torch.full((groups, n_out), 1 << (bits - 1)) if sym else torch.randint(1 if fmt == "gptq" else 0, top + 1, (groups, n_out), generator=g)
        s = (torch.rand(groups, n_out, generator=g) * 0.1 + 0.01).to(torch.float16)
        g_idx = torch.randperm(n_in, generator=g) % groups if desc_act else torch.arange(n_in) // GROUP
        w = torch.empty(n_out, n_in)
        for i in range(n_in):
            w[:, i] = ((q[i] - z[g_idx[i]]).float() * s[g_idx[i]].float()).to(torch.float16).float()
        want[p] = w
        stored_z = (z - (1 if fmt == "gptq" else 0)).tolist()
        if bits == 3:  # 32 rows in 3 words; zeros: 32 columns in 3 words
            qw = [[0] * n_out for _ in range(n_in * 3 // 32)]
            for o in range(n_out):
                for blk in range(n_in // 32):
                    for k, word in enumerate(_stream([int(q[blk * 32 + e, o]) for e in range(32)], 3, 3)):
                        qw[blk * 3 + k][o] = word
            qz = [[word for blk in range(n_out // 32) for word in _stream(row[blk * 32 : (blk + 1) * 32], 3, 3)] for row in stored_z]
        else:
            pf = 32 // bits
            qw = [[_word([int(q[r * pf + j, o]) for j in range(pf)], bits) for o in range(n_out)] for r in range(n_in // pf)]
            qz = [[_word(row[c * pf : (c + 1) * pf], bits) for c in range(n_out // pf)] for row in stored_z]
        state[p + ".qweight"] = torch.tensor(qw, dtype=torch.int32)
        state[p + ".qzeros"] = torch.tensor(qz, dtype=torch.int32)
        state[p + ".scales"] = s
        state[p + ".g_idx"] = g_idx.to(torch.int32)
    qc = {"quant_method": "gptq", "bits": bits, "group_size": GROUP, "desc_act": desc_act, "sym": sym, "damp_percent": 0.01, "static_groups": False, "true_sequential": True,
          "lm_head": False, "checkpoint_format": fmt, "meta": {"quantizer": ["gptqmodel:2.2.0"], "damp_auto_increment": 0.0025}}  # fmt: skip
    got, record = _load(_write(src, tmp_path / f"gptq{bits}", state, qc))
    for p, w in want.items():
        assert torch.equal(got[p + ".weight"], w), p
    _check_rest(got, src, set(want))
    assert record["weights"] == f"int{bits}" and record["layers"] == 14 and ("act-order" in record["note"]) == desc_act


# ----------------------------------------------------------------------------- AWQ
def test_awq_gemm(tmp_path: Path) -> None:
    """AutoAWQ GEMM: qweight int32 [in, out/8] and qzeros [groups, out/8] with output
    columns interleaved 0 2 4 6 1 3 5 7 in each word; scales fp16 [groups, out]."""
    src = _tiny_llama()
    g = torch.Generator().manual_seed(4)
    state = _plain(src, {p for p, _, _ in _linears(src)})
    want = {}
    for p, n_out, n_in in _linears(src):
        groups = n_in // GROUP
        q = torch.randint(0, 16, (n_in, n_out), generator=g)
        z = torch.randint(0, 16, (groups, n_out), generator=g)
        s = (torch.rand(groups, n_out, generator=g) * 0.1 + 0.01).to(torch.float16)
        want[p] = torch.stack([((q[i] - z[i // GROUP]).float() * s[i // GROUP].float()).to(torch.float16).float() for i in range(n_in)], dim=1)

        def pack(m: torch.Tensor) -> torch.Tensor:
            rows = m.tolist()
            return torch.tensor([[_word([row[8 * c + AWQ_ORDER[k]] for k in range(8)], 4) for c in range(len(row) // 8)] for row in rows], dtype=torch.int32)

        state[p + ".qweight"], state[p + ".qzeros"], state[p + ".scales"] = pack(q), pack(z), s
    qc = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm", "modules_to_not_convert": None}
    got, record = _load(_write(src, tmp_path / "awq", state, qc))
    for p, w in want.items():
        assert torch.equal(got[p + ".weight"], w), p
    _check_rest(got, src, set(want))
    assert record["weights"] == "int4" and "AWQ GEMM" in record["note"]


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("qc", "words"),
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemv"}, "an AWQ checkpoint in the gemv layout"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "a GPTQ checkpoint in the marlin format"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "a bitsandbytes quantized checkpoint"),
        ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}, "a compressed-tensors nvfp4-pack-quantized checkpoint"),
    ],
)
def test_other_formats_refused_before_the_model_is_built(tmp_path: Path, qc: dict[str, Any], words: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import transformers

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("a model was built before the format was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", boom)
    with pytest.raises(ModelLoadError) as e:
        quant.load_quantized_checkpoint(tmp_path, SimpleNamespace(quantization_config=qc), torch.float32)
    line = e.value.one_line()
    assert words in line and "which specprobe does not read" in line and "--target-quant" in line, line


def test_a_packed_3_bit_compressed_tensors_checkpoint_is_refused(tmp_path: Path) -> None:
    src = _tiny_llama()
    p, n_out, n_in = _linears(src)[0]
    state = {**_plain(src, {p}), p + ".weight_packed": torch.zeros(n_out, n_in * 3 // 32 + 1, dtype=torch.int32), p + ".weight_scale": torch.ones(n_out, 1), p + ".weight_shape": torch.tensor([n_out, n_in])}
    folder = _write(src, tmp_path / "ct3", state, _ct_qc("pack-quantized", {"num_bits": 3, "symmetric": True, "strategy": "channel"}))
    with pytest.raises(ModelLoadError, match="pack-quantized 3-bit checkpoint"):
        _load(folder)


def test_a_gptq_checkpoint_through_the_loader(tmp_path: Path) -> None:
    """load_model reads config.json's quantization_config and records the checkpoint."""
    from specprobe.models.loader import load_model
    from tests.helpers.tiny import base_vocab

    _ = base_vocab  # the tiny family's tokenizer is not needed: the loader reads only what config.json names
    src = _tiny_llama()
    state = _plain(src, {p for p, _, _ in _linears(src)})
    for p, n_out, n_in in _linears(src):
        state[p + ".qweight"] = torch.full((n_in // 8, n_out), _word([9] * 8, 4), dtype=torch.int32)  # q = 9
        state[p + ".qzeros"] = torch.full((n_in // GROUP, n_out // 8), _word([7] * 8, 4), dtype=torch.int32)  # z = 8
        state[p + ".scales"] = torch.full((n_in // GROUP, n_out), 0.5, dtype=torch.float16)
    folder = _write(src, tmp_path / "gptq-loader", state, {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": True, "checkpoint_format": "gptq"})
    _tokenizer_for(folder)
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    assert loaded.checkpoint_quant["weights"] == "int4"  # type: ignore[attr-defined]
    up = loaded.model.model.layers[0].mlp.up_proj
    assert up.qweight.dtype == torch.int32 and up.qweight.shape == (4, 64)  # held as stored: 8 rows a word
    assert torch.equal(up.weight_float(), torch.full((64, 32), 0.5))  # (9 − 8) · 0.5


def _tokenizer_for(folder: Path) -> None:
    from tests.helpers.tiny import _tokenizer, base_vocab

    tok = _tokenizer(base_vocab())
    tok.save_pretrained(folder)
