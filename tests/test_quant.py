"""The RTN weight quantizer (specprobe.precision.quant) against closed forms: the e4m3 grid
and its saturation, per-channel and per-tensor scales, int8/int4 ranges, the int4 group
reshape, error bounds against the original weights, and the swap back to full precision."""

from __future__ import annotations

import pytest
import torch

from specprobe.core.errors import ConfigError, ModelLoadError
from specprobe.precision import qlinear, quant
from tests.helpers.tiny import spy_attention
from tests.helpers.tiny import tiny_llama as _tiny_llama


def _w(out: int = 6, inp: int = 256, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g)
    return w * torch.logspace(-2, 1, out).unsqueeze(1)  # rows of very different scale


def test_e4m3_grid_and_saturation() -> None:
    x = torch.tensor([0.0, 1.0, 1.0625, 1.125, 17.0, 448.0, 449.0, 1e6, -1e6, 2.0**-9])
    y = quant.fp8_e4m3(x)
    # 1 + 2^-4 is halfway between 1 and 1.125 (3 mantissa bits): ties to even → 1.0;
    # 17 lies between 16 and 18 (step 2 in [16, 32)) → 16 (tie to even); beyond 448 saturates
    assert y.tolist() == [0.0, 1.0, 1.0, 1.125, 16.0, 448.0, 448.0, 448.0, -448.0, 2.0**-9]


def test_fp8_per_channel_scale_maps_each_row_max_to_448() -> None:
    w = _w()
    deq, scale = quant.fp8_weight(w)
    assert scale.shape == (6, 1)
    assert torch.allclose(scale.squeeze(1), w.abs().amax(dim=1) / 448)
    # each row's largest weight is exactly representable (448 · scale)
    assert torch.allclose(deq.abs().amax(dim=1), w.abs().amax(dim=1))
    # the values are e4m3 values times the row's scale
    q = deq / scale
    assert torch.allclose(q, quant.fp8_e4m3(q), rtol=1e-6, atol=0)
    # relative error per element ≤ half an e4m3 ulp (2^-4) in the normal range
    normal = (w / scale).abs() >= 2.0**-6
    rel = ((deq - w).abs() / w.abs())[normal]
    assert float(rel.max()) <= 2.0**-4 + 1e-6


def test_fp8_per_tensor_loses_small_rows() -> None:
    # e4m3's relative precision is scale-free down to 2^-6 · scale: a row 10^4 below the
    # tensor's max falls into the subnormals under one scale, not under its own
    w = _w()
    w[0] *= 1e-3
    chan, _ = quant.fp8_weight(w)
    tensor, scale = quant.fp8_weight(w, per_tensor=True)
    assert scale.numel() == 1 and torch.isclose(scale, w.abs().amax() / 448)
    err = lambda d: float(((d - w)[0]).norm() / w[0].norm())  # noqa: E731  the smallest row
    assert err(tensor) > err(chan)


def test_int8_per_channel_symmetric() -> None:
    w = _w()
    deq, scale = quant.int_weight(w, 8)
    assert scale.shape == (6, 1)
    assert torch.allclose(scale.squeeze(1), w.abs().amax(dim=1) / 127.5)
    q = deq / scale
    assert torch.allclose(q, q.round(), atol=1e-3)
    assert float(q.min()) >= -128 - 1e-3 and float(q.max()) <= 127 + 1e-3
    # round-to-nearest: at most half a step off, but for the +amax end clamped to 127
    assert float(((deq - w).abs() / scale).max()) <= 0.5 + 1e-4


def test_int4_groups_of_128() -> None:
    w = _w(4, 256)
    w[0, :128] *= 100  # one group of a row far larger than its neighbour
    deq, scale = quant.int_weight(w, 4, 128)
    assert scale.shape == (4, 2)  # two groups per row
    assert torch.allclose(scale, w.reshape(4, 2, 128).abs().amax(dim=2) / 7.5)
    q = (deq.reshape(4, 2, 128) / scale.unsqueeze(2))
    assert torch.allclose(q, q.round(), atol=1e-3) and float(q.min()) >= -8 - 1e-3 and float(q.max()) <= 7 + 1e-3
    # the second group keeps its own precision despite the first
    g2 = (deq[0, 128:] - w[0, 128:]).abs().max()
    assert float(g2) <= 0.5 * float(scale[0, 1]) + 1e-6
    # 16 levels per group at most
    assert all(len(torch.unique(q[r, g].round())) <= 16 for r in range(4) for g in range(2))


def test_int4_ragged_last_group() -> None:
    w = _w(3, 200)
    deq, scale = quant.int_weight(w, 4, 128)
    assert deq.shape == w.shape and scale.shape == (3, 2)
    assert torch.allclose(scale[:, 1], w[:, 128:].abs().amax(dim=1) / 7.5)


def test_error_grows_as_bits_fall() -> None:
    w = _w(16, 512)
    err = {s: float((quant.quantize_weight(w, s) - w).norm() / w.norm()) for s in quant.SCHEMES}
    assert 0 < err["int8"] < err["fp8"] < err["int4"] < 0.2
    assert err["fp8"] < err["fp8:per-tensor"]


def test_dtype_kept() -> None:
    w = _w().to(torch.bfloat16)
    for s in quant.SCHEMES:
        assert quant.quantize_weight(w, s).dtype == torch.bfloat16


def test_scheme_refused_like_any_setting() -> None:
    from specprobe.settings.model import check

    assert check("target_quant", "int4", "--target-quant") == "int4"
    with pytest.raises(ConfigError, match="--target-quant 'int3' is not one of fp8, fp8:per-tensor, fp8-dynamic, int8, w8a8-int8, int4"):
        check("target_quant", "int3", "--target-quant")
    with pytest.raises(ConfigError, match="probe.yaml: draft_quant"):
        check("draft_quant", "nf4", "probe.yaml: draft_quant")



def test_model_decoder_linears_only_and_swap_back() -> None:
    from specprobe.precision.qlinear import QuantLinear

    m = _tiny_llama()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    storage = {k: v.data_ptr() for k, v in m.state_dict().items()}
    done = quant.quantize_model(m, "int4", keep=True)
    assert len(done.layers) == 2 * 7  # q, k, v, o, gate, up, down per layer
    for name, mod in m.named_modules():  # the decoder linears are held quantized, the rest as it was
        if name.startswith("model.layers.") and name.endswith("proj"):
            assert isinstance(mod, QuantLinear) and mod.q.dtype == torch.uint8, name
            assert torch.equal(mod.weight_float(), quant.quantize_weight(before[name + ".weight"], "int4")), name
    for k, v in m.state_dict().items():
        if not k.startswith("model.layers.") or "proj" not in k:
            assert torch.equal(v, before[k]), k
    assert 0 < done.rel_error < 0.2
    rec = done.record()
    assert rec["scheme"] == "int4" and "not AWQ/GPTQ" in rec["note"]
    x = torch.tensor([[1, 2, 3, 4]])
    served = m(x).logits
    with quant.full_precision(done):
        after = m.state_dict()
        assert after.keys() == before.keys()
        for k, v in after.items():  # the very tensors loaded: no float copy was made
            assert torch.equal(v, before[k]) and v.data_ptr() == storage[k], k
        full = m(x).logits
    assert not torch.equal(served, full)
    assert torch.equal(m(x).logits, served)  # the quantized weights are back


@pytest.mark.parametrize("scheme", ["fp8", "fp8:per-tensor", "int8", "int4"])
def test_held_quantized_equals_dequantized_at_load(scheme: str) -> None:
    """The weights held quantized (fp8 as float8_e4m3fn, int8, int4 two to a byte)
    dequantize to exactly the weights the dequantize-everything path writes, and the model
    gives the same logits; without keep the float weights are gone."""
    from specprobe.precision.qlinear import quant_linears, weight_bytes

    ref, held = _tiny_llama(), _tiny_llama()
    for _, mod in qlinear.decoder_linears(ref):
        mod.weight.data = quant.quantize_weight(mod.weight.data, scheme)
    full_bytes = weight_bytes(held)
    quant.quantize_model(held, scheme)
    stored = {"fp8": torch.float8_e4m3fn, "fp8:per-tensor": torch.float8_e4m3fn, "int8": torch.int8, "int4": torch.uint8}[scheme]
    layers = dict(quant_linears(held))
    assert len(layers) == 14 and all(m.q.dtype == stored for m in layers.values())
    for name, mod in qlinear.decoder_linears(ref):
        assert torch.equal(layers["model." + name].weight_float(), mod.weight), name
    x = torch.tensor([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6]])
    with torch.no_grad():
        assert torch.equal(held(x).logits, ref(x).logits)
    linear_bytes = sum(m.weight.numel() * 4 for _, m in qlinear.decoder_linears(ref))
    saved = full_bytes - weight_bytes(held)  # fp32 -> 1 byte (fp8, int8) or half a byte (int4), plus the scales
    assert saved > linear_bytes * (0.6 if scheme == "int4" else 0.5), (saved, linear_bytes)


def test_int4_packing_two_to_a_byte() -> None:
    from specprobe.precision.qlinear import pack_int4, unpack_int4

    q = torch.tensor([[-8, 7, 0, -1, 3, -3]])
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.tolist() == [[0 | (15 << 4), 8 | (7 << 4), 11 | (5 << 4)]]  # q + 8, column 2j low
    assert torch.equal(unpack_int4(packed), q.to(torch.int8))
    w = _w(3, 200)  # a ragged last group (200 = 128 + 72) and an odd pad
    held = quant.quantized_linear(_linear(w), "int4")
    assert held.q.shape == (3, 128) and torch.equal(held.weight_float(), quant.quantize_weight(w, "int4"))


def _linear(w: torch.Tensor, bias: bool = False) -> torch.nn.Linear:
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=bias)
    lin.weight.data = w.clone()
    return lin


# ----------------------------------------------------------------------------- W8A8: activations quantized per token
def test_fp8_dynamic_per_token_activations_closed_form() -> None:
    """fp8-dynamic (llm-compressor's FP8_DYNAMIC, vLLM's W8A8 fp8): fp8 weights per channel
    and each token's activations scaled by amax / 448 onto the e4m3 grid, then the product."""
    from specprobe.precision.qlinear import FP8_MIN_SCALE, quantize_activations

    w = _w(8, 64)
    lin = _linear(w, bias=True)
    held = quant.quantized_linear(lin, "fp8-dynamic")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 64, generator=g) * torch.tensor([0.01, 1.0, 300.0]).reshape(1, 3, 1)  # tokens of very different size
    x[1, 2] = 0.0  # a token of zeros
    scale = (x.abs().amax(dim=-1, keepdim=True) / 448).clamp(min=1 / (448 * 512))
    xq = (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert float(scale[1, 2]) == pytest.approx(FP8_MIN_SCALE, rel=1e-6) and torch.equal(xq[1, 2], torch.zeros(64))
    assert torch.equal(xq[:2].abs().amax(dim=-1)[:, :2], torch.full((2, 2), 448.0))  # each token's largest value maps to 448
    got = quantize_activations(x, quant.ACTIVATIONS["fp8-dynamic"])
    assert torch.allclose(got, xq * scale, rtol=1e-6, atol=0)
    want = (xq * scale) @ quant.quantize_weight(w, "fp8").t() + lin.bias
    with torch.no_grad():
        out = held(x)
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(out, lin(x), rtol=1e-5, atol=1e-6)
    assert quant.quantize_model(_tiny_llama(), "fp8-dynamic").record()["activations"] == "fp8 dynamic per token"


def test_w8a8_int8_per_token_activations_closed_form() -> None:
    """w8a8-int8 (llm-compressor's W8A8, vLLM's W8A8 int8): int8 weights per channel and each
    token's activations symmetric int8 with scale amax / 127, rounded half to even."""
    from specprobe.precision.qlinear import quantize_activations

    w = _w(8, 64)
    held = quant.quantized_linear(_linear(w), "w8a8-int8")
    x = torch.tensor([[127.0, 63.5, -0.5, 1.5, 2.5] + [0.0] * 59])  # amax 127: the scale is 1, ties go to even
    assert quantize_activations(x, quant.ACTIVATIONS["w8a8-int8"])[0, :5].tolist() == [127.0, 64.0, -0.0, 2.0, 2.0]
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 64, generator=g) * 3
    amax = x.abs().amax(dim=-1, keepdim=True)
    q = torch.round(x * (127 / amax)).clamp(-128, 127)
    assert torch.equal(q.abs().amax(dim=-1), torch.full((4,), 127.0))
    with torch.no_grad():
        assert torch.allclose(held(x), (q * amax / 127) @ quant.quantize_weight(w, "int8").t(), rtol=1e-5, atol=1e-6)
    zero = torch.zeros(2, 64)
    assert torch.equal(quantize_activations(zero, quant.ACTIVATIONS["w8a8-int8"]), zero)


def test_int8_asymmetric_and_static_activations() -> None:
    """vLLM's asymmetric dynamic int8 (scale (max − min) / 255, azp = round(−128 − min/scale))
    and the static schemes (a checkpoint's input_scale and zero point)."""
    from specprobe.precision.qlinear import quantize_activations

    x = torch.tensor([[0.0, 1.0, 2.55, 0.5]])  # min 0, max 2.55: scale 0.01, azp −128
    got = quantize_activations(x, {"type": "int", "strategy": "token", "dynamic": True, "symmetric": False})
    assert torch.allclose(got, x, atol=1e-6)  # every value on the grid
    y = torch.tensor([[-1.0, 3.0, 0.004]])  # scale 4/255; azp = round(−128 + 255/4) = −64
    s = 4 / 255
    want = (torch.round(y / s) - 64).clamp(-128, 127).add(64) * s
    assert torch.allclose(quantize_activations(y, {"type": "int", "strategy": "token", "dynamic": True, "symmetric": False}), want, atol=1e-7)
    static = {"type": "float", "strategy": "tensor", "dynamic": False, "input_scale": torch.tensor(0.5)}
    assert quantize_activations(torch.tensor([1000.0, 0.3]), static).tolist() == [224.0, 0.3125]  # saturates at 448 · 0.5; 0.6 -> 0.625 on the grid
    static_int = {"type": "int", "strategy": "tensor", "dynamic": False, "input_scale": torch.tensor(0.1), "input_zero_point": torch.tensor(10)}
    assert torch.allclose(quantize_activations(torch.tensor([0.04, 20.0, -20.0]), static_int), torch.tensor([0.0, 11.7, -13.8]), atol=1e-6)


def test_per_group_activations() -> None:
    from specprobe.precision.qlinear import quantize_activations

    x = torch.cat([torch.full((1, 4), 0.001), torch.full((1, 4), 100.0)], dim=1)
    x[0, 0], x[0, 4] = 0.002, 200.0
    got = quantize_activations(x, {"type": "float", "strategy": "group", "dynamic": True, "group_size": 4})
    assert torch.allclose(got, x, rtol=0.07)  # each group of 4 gets its own scale: the small one keeps its values
    assert not torch.allclose(quantize_activations(x, {"type": "float", "strategy": "token", "dynamic": True})[0, :4], x[0, :4], rtol=0.07)


# ----------------------------------------------------------------------------- the fp8 KV cache
def _spy_attention(seen: list[tuple[torch.Tensor, torch.Tensor]]) -> str:
    """An attention implementation that records the K/V it is given and runs sdpa."""
    return spy_attention("specprobe_test_spy", lambda q, k, v: seen.append((k.detach().clone(), v.detach().clone())))


def test_fp8_kv_values_seen_by_attention_are_e4m3() -> None:
    m = _tiny_llama()
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    m.config._attn_implementation = _spy_attention(seen)
    x = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        full = m(x).logits
        assert any(not torch.equal(k, quant.fp8_e4m3(k)) for k, _ in seen)  # sanity: raw K is not on the grid
        seen.clear()
        quant.fp8_kv_cache(m)
        served = m(x).logits
        assert len(seen) == 2  # one per layer
        for k, v in seen:
            assert torch.equal(k, quant.fp8_e4m3(k)) and torch.equal(v, quant.fp8_e4m3(v))
        # generation with a cache: every step's keys (old and new) are on the grid
        seen.clear()
        m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert len(seen) == 2 * 3 and all(torch.equal(k, quant.fp8_e4m3(k)) for k, _ in seen)
    # a bounded change of the logits: e4m3 keeps ~2^-4 relative precision
    diff = (served - full).abs().max() / full.abs().max()
    assert 0 < float(diff) < 0.05


def test_fp8_kv_scale() -> None:
    x = torch.randn(2, 2, 5, 8) * 3
    y = quant.fp8_kv(x, 0.5)
    assert torch.equal(y / 0.5, quant.fp8_e4m3(y / 0.5))
    assert torch.equal(quant.fp8_kv(torch.tensor([1000.0])), torch.tensor([448.0]))  # saturates at scale 1


def test_fp8_kv_is_per_model() -> None:
    a, b = _tiny_llama(), _tiny_llama()
    quant.fp8_kv_cache(a)
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert b.config._attn_implementation == "sdpa"
        assert not torch.equal(a(x).logits, b(x).logits)


# ----------------------------------------------------------------------------- a compressed-tensors fp8 checkpoint
def _write_fp8_checkpoint(src, folder, strategy: str = "channel", acts=None):
    """The layout llm-compressor writes for FP8 (format float-quantized): every decoder
    Linear's weight in float8_e4m3fn beside its weight_scale ([out, 1] per channel), the
    LM head and embeddings left as they are, quantization_config in config.json."""
    import json

    from safetensors.torch import save_file

    src.save_pretrained(folder, safe_serialization=True)
    state = {k: v.clone().contiguous() for k, v in src.state_dict().items()}
    for name, _mod in qlinear.decoder_linears(src):
        key = f"model.{name}.weight"
        w = state[key].float()
        amax = w.abs().amax() if strategy == "tensor" else w.abs().amax(dim=1, keepdim=True)
        scale = amax / 448
        state[key] = (w / scale).to(torch.float8_e4m3fn)
        state[key + "_scale"] = scale.reshape(1) if strategy == "tensor" else scale
    for f in folder.glob("*.safetensors"):
        f.unlink()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}, "input_activations": acts}},
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_fp8_checkpoint_reads_as_served(tmp_path, strategy) -> None:
    from transformers import AutoConfig

    src = _tiny_llama()
    folder = _write_fp8_checkpoint(src, tmp_path / "fp8", strategy)
    from tests.helpers.quantized import same_as_reference

    cfg = AutoConfig.from_pretrained(folder)
    model, record = quant.load_quantized_checkpoint(folder, cfg, torch.float32, in_memory=False)
    assert record["method"] == "checkpoint" and record["layers"] == 14 and record["weights"] == ("fp8" if strategy == "channel" else "fp8:per-tensor")
    held, _ = quant.load_quantized_checkpoint(folder, cfg, torch.float32)
    assert same_as_reference(held, model) == 14
    assert held.model.layers[1].self_attn.o_proj.weight.dtype == torch.float8_e4m3fn  # the stored tensor, as stored
    # the weights are exactly what the simulation produces from the full-precision model
    simulated = _tiny_llama()
    for _, mod in qlinear.decoder_linears(simulated):
        mod.weight.data = quant.quantize_weight(mod.weight.data, "fp8" if strategy == "channel" else "fp8:per-tensor")
    for (k, v), (k2, v2) in zip(model.state_dict().items(), simulated.state_dict().items(), strict=True):
        assert k == k2 and torch.allclose(v, v2, rtol=1e-6, atol=1e-7), k


def test_fp8_dynamic_checkpoint_quantizes_its_activations(tmp_path) -> None:
    """llm-compressor's FP8_DYNAMIC: fp8 weights per channel, input_activations {type float,
    strategy token, dynamic true} — read from the config, each token's activations go onto
    the e4m3 grid with scale amax / 448 before the matmul, as vLLM runs it."""
    from transformers import AutoConfig

    acts = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True, "observer": None}
    folder = _write_fp8_checkpoint(_tiny_llama(), tmp_path / "fp8-dynamic", acts=acts)
    held, record = quant.load_quantized_checkpoint(folder, AutoConfig.from_pretrained(folder), torch.float32)
    assert record["activations"] == "fp8 dynamic per token" and record["weights"] == "fp8"
    mod = held.model.layers[0].self_attn.q_proj
    x = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(7))
    scale = x.abs().amax(dim=-1, keepdim=True) / 448
    xq = (x / scale).to(torch.float8_e4m3fn).float() * scale
    with torch.no_grad():
        assert torch.allclose(mod(x), xq @ mod.weight_float().t(), rtol=1e-5, atol=1e-6)
    static = {**acts, "dynamic": False, "strategy": "tensor"}  # a static scheme needs its input_scale
    with pytest.raises(ModelLoadError, match="static but its checkpoint has no input_scale"):
        quant.load_quantized_checkpoint(_write_fp8_checkpoint(_tiny_llama(), tmp_path / "fp8-static", acts=static), AutoConfig.from_pretrained(tmp_path / "fp8-static"), torch.float32)


def test_other_quantized_checkpoints_are_refused(tmp_path) -> None:
    from types import SimpleNamespace

    from specprobe.core.errors import ModelLoadError

    # GPTQ, AWQ and the compressed-tensors int packings are read (tests/test_quant_checkpoints.py)
    cfg = SimpleNamespace(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"})
    with pytest.raises(ModelLoadError, match="a GPTQ checkpoint in the marlin format .*, which specprobe does not read"):
        quant.load_quantized_checkpoint(tmp_path, cfg, torch.float32)
