"""The RTN weight quantizer (specprobe.models.quant) against closed forms: the e4m3 grid
and its saturation, per-channel and per-tensor scales, int8/int4 ranges, the int4 group
reshape, error bounds against the original weights, and the swap back to full precision."""

from __future__ import annotations

import pytest
import torch

from specprobe.core.errors import ConfigError
from specprobe.models import quant


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
    with pytest.raises(ConfigError, match="--target-quant 'int3' is not one of fp8, fp8:per-tensor, int8, int4"):
        check("target_quant", "int3", "--target-quant")
    with pytest.raises(ConfigError, match="probe.yaml: draft_quant"):
        check("draft_quant", "nf4", "probe.yaml: draft_quant")


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_model_decoder_linears_only_and_swap_back() -> None:
    m = _tiny_llama()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    done = quant.quantize_model(m, "int4", keep=True)
    assert len(done.layers) == 2 * 7  # q, k, v, o, gate, up, down per layer
    after = m.state_dict()
    for k in before:
        changed = not torch.equal(before[k], after[k])
        assert changed == (k.startswith("model.layers.") and k.endswith("proj.weight")), k
    assert 0 < done.rel_error < 0.2
    rec = done.record()
    assert rec["scheme"] == "int4" and "not AWQ/GPTQ" in rec["note"]
    x = torch.tensor([[1, 2, 3, 4]])
    served = m(x).logits
    with quant.full_precision(done):
        for k, v in m.state_dict().items():
            assert torch.equal(v, before[k])
        full = m(x).logits
    assert not torch.equal(served, full)
    assert torch.equal(m(x).logits, served)  # the quantized weights are back


# ----------------------------------------------------------------------------- the fp8 KV cache
def _spy_attention(seen: list[tuple[torch.Tensor, torch.Tensor]]) -> str:
    """An attention implementation that records the K/V it is given and runs sdpa."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    def spy(mod, q, k, v, *a, **kw):
        seen.append((k.detach().clone(), v.detach().clone()))
        return sdpa_attention_forward(mod, q, k, v, *a, **kw)

    AttentionInterface.register("specprobe_test_spy", spy)
    ALL_MASK_ATTENTION_FUNCTIONS.register("specprobe_test_spy", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return "specprobe_test_spy"


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
def _write_fp8_checkpoint(src, folder, strategy: str = "channel"):
    """The layout llm-compressor writes for FP8 (format float-quantized): every decoder
    Linear's weight in float8_e4m3fn beside its weight_scale ([out, 1] per channel), the
    LM head and embeddings left as they are, quantization_config in config.json."""
    import json

    from safetensors.torch import save_file

    src.save_pretrained(folder, safe_serialization=True)
    state = {k: v.clone().contiguous() for k, v in src.state_dict().items()}
    for name, _mod in quant.decoder_linears(src):
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
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}, "input_activations": None}},
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_fp8_checkpoint_reads_as_served(tmp_path, strategy) -> None:
    from transformers import AutoConfig

    src = _tiny_llama()
    folder = _write_fp8_checkpoint(src, tmp_path / "fp8", strategy)
    model, record = quant.load_quantized_checkpoint(folder, AutoConfig.from_pretrained(folder), torch.float32)
    assert record["method"] == "checkpoint" and record["layers"] == 14 and record["weights"] == ("fp8" if strategy == "channel" else "fp8:per-tensor")
    # the weights are exactly what the simulation produces from the full-precision model
    simulated = _tiny_llama()
    quant.quantize_model(simulated, "fp8" if strategy == "channel" else "fp8:per-tensor")
    for (k, v), (k2, v2) in zip(model.state_dict().items(), simulated.state_dict().items(), strict=True):
        assert k == k2 and torch.allclose(v, v2, rtol=1e-6, atol=1e-7), k


def test_other_quantized_checkpoints_are_refused(tmp_path) -> None:
    from types import SimpleNamespace

    from specprobe.core.errors import ModelLoadError

    # GPTQ, AWQ and the compressed-tensors int packings are read (tests/test_quant_checkpoints.py)
    cfg = SimpleNamespace(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"})
    with pytest.raises(ModelLoadError, match="a GPTQ checkpoint in the marlin format .*, which specprobe does not read"):
        quant.load_quantized_checkpoint(tmp_path, cfg, torch.float32)
