"""llama.cpp's KV-cache types: ggml's block rounding against its closed forms and against
gguf-py's reference quantizers, the attention seeing rounded Q/K/V, the setting's values,
and llama-server's --cache-type-k/-v (and TensorRT-LLM's kv_cache_config.dtype) read from
serving configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from specprobe.core.errors import ConfigError, ModelLoadError
from specprobe.precision import ggml_blocks
from specprobe.precision.kv_served import ggml_kv_cache, kv_types
from specprobe.settings.model import GGML_KV_TYPES, for_command, parse_kv_cache_dtype
from specprobe.settings.options import merge
from specprobe.settings.serving import read_serving_config
from tests.helpers.tiny import spy_attention, tiny_llama


# ----------------------------------------------------------------------------- closed forms
def test_q8_0_block_closed_form() -> None:
    # amax 127 · 0.01: d = 0.01 (stored as f16), every value k · 0.01 comes back as k · fp16(0.01)
    k = torch.arange(-127, 129, 8).float()[:32]
    k[0] = -127.0
    x = k * 0.01
    d16 = float(torch.tensor(0.01).half().float())
    assert torch.equal(ggml_blocks.ggml_round(x, "q8_0"), k * d16)
    # a zero block stays zero (d = 0, id = 0), no NaN
    assert torch.equal(ggml_blocks.ggml_round(torch.zeros(2, 32), "q8_0"), torch.zeros(2, 32))


def test_q4_0_maps_the_largest_magnitude_to_minus_8() -> None:
    x = torch.zeros(32)
    x[3], x[7], x[9] = -2.0, 1.0, 0.3
    y = ggml_blocks.ggml_round(x, "q4_0")
    # m = -2 → d = 0.25: -2 → (0 − 8)·d, 1.0 → q = trunc(4 + 8.5) = 12 → 1.0, 0.3 → trunc(1.2 + 8.5) = 9 → 0.25
    assert (float(y[3]), float(y[7]), float(y[9]), float(y[0])) == (-2.0, 1.0, 0.25, 0.0)
    # a positive extreme maps to -8 too: d is negative, +m → (0 − 8)·d = m, and -m clips at q = 15 (7·|d|)
    z = torch.zeros(32)
    z[0], z[1] = 2.0, -2.0
    w = ggml_blocks.ggml_round(z, "q4_0")
    assert (float(w[0]), float(w[1])) == (2.0, -1.75)


def test_q4_1_min_and_step() -> None:
    x = torch.linspace(-1.0, 2.0, 32)
    y = ggml_blocks.ggml_round(x, "q4_1")
    d16 = float(torch.tensor(3.0 / 15).half().float())
    assert float(y.min()) == -1.0 and torch.allclose(y.max(), torch.tensor(-1.0 + 15 * d16))
    assert len(torch.unique(y)) <= 16


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_same_as_gguf_reference_quantizer(name: str) -> None:
    """gguf-py's numpy port of ggml's quantize_row_*_ref, dequantized: the same values. Q8_0's
    server routine (AVX2) multiplies by 127 / amax and rounds half to even where the
    reference multiplies by 1 / d and rounds half away from zero: at most one step apart,
    on a few values in a hundred thousand."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 4096)) * rng.uniform(0.01, 10, (64, 1))).astype(np.float32)
    ref = dequantize(quantize(x, Q[name]), Q[name]).reshape(x.shape)
    ours = ggml_blocks.ggml_round(torch.from_numpy(x), name.lower()).numpy()
    if name != "Q8_0":
        assert np.array_equal(ours, ref)
        return
    diff = ours != ref
    assert diff.mean() < 1e-4
    d = np.abs(x).reshape(-1, 32).max(axis=1) / 127
    step = np.repeat(d.astype(np.float16).astype(np.float32), 32).reshape(x.shape)
    assert np.all(np.abs(ours - ref)[diff] <= step[diff] * 1.0001)


def test_rounding_is_idempotent_and_keeps_dtype() -> None:
    x = torch.randn(3, 4, 5, 64)
    for t in ggml_blocks.TYPES:
        once = ggml_blocks.ggml_round(x, t)
        assert once.shape == x.shape and once.dtype == x.dtype
        if t in ("f32", "f16", "bf16", "q8_0"):
            assert torch.equal(ggml_blocks.ggml_round(once, t), once)
    assert ggml_blocks.ggml_round(x.to(torch.bfloat16), "q8_0").dtype == torch.bfloat16
    # error ordered by bits
    err = {t: float((ggml_blocks.ggml_round(x, t) - x).abs().mean()) for t in ("f16", "q8_0", "q5_0", "q4_0")}
    assert err["f16"] < err["q8_0"] < err["q5_0"] < err["q4_0"]
    with pytest.raises(ValueError, match="multiple of 32"):
        ggml_blocks.ggml_round(torch.randn(4, 48), "q8_0")


def test_query_type_follows_the_k_type() -> None:
    assert [ggml_blocks.query_type(t) for t in ("f16", "bf16", "f32", "q8_0", "q4_0", "q5_1")] == ["f16", "bf16", "f32", "q8_0", "q8_0", "q8_0"]
    assert set(ggml_blocks.TYPES) == set(GGML_KV_TYPES)  # the setting and the simulation list the same types


# ----------------------------------------------------------------------------- in the attention
def _tiny_llama(head_dim: int = 32) -> Any:
    return tiny_llama(hidden=4 * head_dim)


def _spy(seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> str:
    return spy_attention("specprobe_test_kv_spy", lambda q, k, v: seen.append((q.detach().clone(), k.detach().clone(), v.detach().clone())))


def test_attention_reads_q8_0_keys_and_values() -> None:
    m = _tiny_llama()
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    m.config._attn_implementation = _spy(seen)
    x = torch.tensor([[1, 2, 3, 4, 5, 6]])
    rnd = ggml_blocks.ggml_round
    with torch.no_grad():
        full = m(x).logits
        assert any(not torch.equal(k, rnd(k, "q8_0")) for _, k, _ in seen)  # raw K is not on the grid
        seen.clear()
        ggml_kv_cache(m, "q8_0/f16")
        served = m(x).logits
        assert len(seen) == 2
        for q, k, v in seen:
            assert torch.equal(k, rnd(k, "q8_0")) and torch.equal(v, rnd(v, "f16")) and torch.equal(q, rnd(q, "q8_0"))
        seen.clear()
        m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
        assert len(seen) == 2 * 3 and all(torch.equal(k, rnd(k, "q8_0")) for _, k, _ in seen)
    diff = float((served - full).abs().max() / full.abs().max())
    assert 0 < diff < 0.05  # 8-bit blocks: a bounded change


def test_logit_change_grows_as_the_cache_narrows() -> None:
    x = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        full = _tiny_llama()(x).logits
        change = {}
        for t in ("f16", "q8_0", "q4_0"):
            m = _tiny_llama()
            ggml_kv_cache(m, t)
            change[t] = float((m(x).logits - full).abs().max())
    assert 0 < change["f16"] < change["q8_0"] < change["q4_0"]


def test_a_head_size_off_the_block_is_refused_as_llama_cpp_does() -> None:
    m = _tiny_llama(head_dim=24)
    with pytest.raises(ModelLoadError, match="blocks of 32, which do not divide the head size 24"):
        ggml_kv_cache(m, "q4_0")
    ggml_kv_cache(_tiny_llama(head_dim=24), "f16")  # the float types have no blocks


# ----------------------------------------------------------------------------- the setting
def test_setting_values() -> None:
    assert parse_kv_cache_dtype("q8_0", "--kv-cache-dtype") == "q8_0"
    assert parse_kv_cache_dtype("q8_0/q8_0", "--kv-cache-dtype") == "q8_0"
    assert parse_kv_cache_dtype("q4_0/f16", "--kv-cache-dtype") == "q4_0/f16"
    assert parse_kv_cache_dtype("fp8", "--kv-cache-dtype") == "fp8"
    assert kv_types("q4_0/f16") == ("q4_0", "f16") and kv_types("fp8") == ("fp8", "fp8")
    for bad in ("iq4_nl", "q3_k", "fp8/q8_0", "q8_0/"):
        with pytest.raises(ConfigError, match="is not a KV-cache dtype specprobe simulates"):
            parse_kv_cache_dtype(bad, "--kv-cache-dtype")


def test_flag_refused_in_one_line() -> None:
    from typer.testing import CliRunner

    from specprobe.cli.main import app

    res = CliRunner().invoke(app, ["diagnose", "t", "d", "--kv-cache-dtype", "q3_K"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "--kv-cache-dtype 'q3_K' is not a KV-cache dtype specprobe simulates" in " ".join(res.output.split())


# ----------------------------------------------------------------------------- serving configs
def _write(folder: Path, name: str, text: str) -> Path:
    p = folder / name
    p.write_text(text, encoding="utf-8")
    return p


def _kv(path: Path) -> tuple[Any, Any, Any, Any]:
    params = {**{s.name: s.default_for("diagnose") for s in for_command("diagnose")}, "target": "t", "drafter": "d", "device": "cpu", "serving_config": [path]}
    opts = merge("diagnose", params, {"serving_config"})
    return opts.values.get("kv_cache_dtype"), opts.values.get("draft_kv_cache_dtype"), opts.origins.get("kv_cache_dtype"), opts.origins.get("draft_kv_cache_dtype")


def test_llama_server_cache_types(tmp_path: Path) -> None:
    both = _write(tmp_path, "serve.sh", "llama-server -m t.gguf -md d.gguf --spec-draft-n-max 4 -ctk q8_0 -ctv q8_0 -fa on\n")
    sv = read_serving_config(both)
    assert (sv.kv_cache_dtype, sv.draft_kv_cache_dtype) == ("q8_0", "f16")  # the draft model's cache stays f16
    v, dv, at, dat = _kv(both)
    assert (v, dv, at) == ("q8_0", "f16", "serve.sh: -ctk, serve.sh: -ctv")
    assert dat.startswith("llama-server's default --cache-type-k-draft/-v-draft f16")
    # K alone: V keeps f16
    k_only = _write(tmp_path, "k.sh", "llama-server -m t.gguf --cache-type-k q4_0\n")
    assert read_serving_config(k_only).kv_cache_dtype == "q4_0/f16"
    assert "llama-server's default --cache-type-v f16" in read_serving_config(k_only).where("kv_cache_dtype")
    # the draft model's own, and the environment
    own = _write(tmp_path, "own.sh", "LLAMA_ARG_CACHE_TYPE_K=q8_0 LLAMA_ARG_CACHE_TYPE_V=q8_0 llama-server -m t.gguf -md d.gguf -ctkd q4_0 --spec-draft-type-v q4_0\n")
    sv = read_serving_config(own)
    assert (sv.kv_cache_dtype, sv.draft_kv_cache_dtype) == ("q8_0", "q4_0")
    assert sv.where("draft_kv_cache_dtype") == "own.sh: -ctkd, own.sh: --spec-draft-type-v"
    # nothing said: nothing filled (the run scores the compute dtype, as before)
    plain = _write(tmp_path, "plain.sh", "llama-server -m t.gguf -md d.gguf\n")
    assert (read_serving_config(plain).kv_cache_dtype, read_serving_config(plain).draft_kv_cache_dtype) == (None, None)


def test_llama_server_refusals(tmp_path: Path) -> None:
    off = _write(tmp_path, "off.sh", "llama-server -m t.gguf -ctv q4_0 -fa off\n")
    with pytest.raises(ConfigError, match=r"off.sh: -ctv q4_0 is a quantized V cache, which llama-server refuses with off.sh: -fa off"):
        read_serving_config(off)
    read_serving_config(_write(tmp_path, "k_off.sh", "llama-server -m t.gguf -ctk q4_0 -fa off\n"))  # a quantized K alone runs without it
    bad = _write(tmp_path, "bad.sh", "llama-server -m t.gguf -ctk q3_K\n")
    with pytest.raises(ConfigError, match="bad.sh: -ctk 'q3_K' is not a KV-cache type llama-server takes"):
        read_serving_config(bad)
    iq = _write(tmp_path, "iq.sh", "llama-server -m t.gguf -ctk iq4_nl\n")
    assert read_serving_config(iq).kv_cache_dtype == "iq4_nl/f16"  # llama-server runs it; specprobe does not simulate it
    with pytest.raises(ConfigError, match="iq.sh: -ctk .* 'iq4_nl/f16' is a KV-cache type specprobe does not simulate"):
        _kv(iq)


def test_trtllm_kv_cache_config_dtype(tmp_path: Path) -> None:
    yaml = _write(tmp_path, "extra.yaml", "speculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n  speculative_model_dir: d\nkv_cache_config:\n  dtype: fp8\n  free_gpu_memory_fraction: 0.8\n")
    sv = read_serving_config(yaml)
    assert sv.kv_cache_dtype == "fp8" and sv.where("kv_cache_dtype") == "extra.yaml: kv_cache_config.dtype"
    assert _kv(yaml)[:3] == ("fp8", None, "extra.yaml: kv_cache_config.dtype")
    nvfp4 = _write(tmp_path, "fp4.yaml", "speculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\nkv_cache_config:\n  dtype: nvfp4\n")
    with pytest.raises(ConfigError, match="fp4.yaml: kv_cache_config.dtype 'nvfp4' is a KV-cache dtype specprobe does not simulate"):
        _kv(nvfp4)


# ----------------------------------------------------------------------------- llama.cpp's rotation of a quantized cache
def test_hadamard_is_orthonormal_and_its_own_inverse() -> None:
    for n in (64, 128):
        h = ggml_blocks.hadamard(n)
        assert torch.allclose(h @ h, torch.eye(n), atol=1e-6) and torch.equal(h, h.T)
        assert torch.all(h.abs() == 1 / n**0.5)
    x = torch.randn(2, 3, 5, 128)
    assert torch.allclose(ggml_blocks.rotate(ggml_blocks.rotate(x, 64), 64), x, atol=1e-5)
    with pytest.raises(ValueError, match="power-of-two"):
        ggml_blocks.hadamard(48)


def test_rotation_orders_as_llama_kv_cache_picks_them() -> None:
    ro = ggml_blocks.rotation_orders
    assert ro("q8_0", "q8_0", 64) == (64, 64)
    assert ro("q4_0", "q4_0", 128) == (128, 64)  # K: the largest power of two dividing the head; V: 64
    assert ro("q8_0", "f16", 192) == (64, None)
    assert ro("f16", "f16", 128) == (None, None)  # float caches are stored as they are
    assert ro("q8_0", "q8_0", 96) == (None, None)  # not a multiple of 64: no rotation


def test_rotated_cache_keeps_q_dot_k_and_its_error_small() -> None:
    m = _tiny_llama(head_dim=64)
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    m.config._attn_implementation = _spy(seen)
    x = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        full = m(x).logits
        raw = [(q.clone(), k.clone()) for q, k, _ in seen]
        seen.clear()
        ggml_kv_cache(m, "q8_0")
        served = m(x).logits
    for (q0, k0), (q, k, v) in zip(raw, seen, strict=True):
        assert torch.equal(k, ggml_blocks.ggml_round(k, "q8_0")) and torch.equal(v, ggml_blocks.ggml_round(v, "q8_0"))
        assert not torch.allclose(k, ggml_blocks.ggml_round(k0, "q8_0"))  # stored rotated, not as computed
        # the rotated, rounded Q·K is the original Q·K up to the 8-bit rounding
        s0, s = q0 @ k0.repeat_interleave(2, 1).transpose(-1, -2), q @ k.repeat_interleave(2, 1).transpose(-1, -2)
        assert float((s - s0).abs().max()) < 0.02 * float(s0.abs().max())
    assert 0 < float((served - full).abs().max() / full.abs().max()) < 0.05


def test_gguf_order_is_llama_cpps_element_order() -> None:
    # llama.cpp's element 2i + h is transformers' h·(d/2) + i: convert_hf_to_gguf's permute
    x = torch.arange(64.0).reshape(1, 1, 1, 64)
    y = ggml_blocks.gguf_order(x).flatten().tolist()
    assert y[:6] == [0.0, 32.0, 1.0, 33.0, 2.0, 34.0] and y[-2:] == [31.0, 63.0]
    # the same rows transformers' GGUF loader moves back (its _reverse_permute_weights)
    w = np.arange(64 * 3).reshape(64, 3)
    gguf_rows = w.reshape(1, 2, 32, 3).swapaxes(1, 2).reshape(64, 3)  # the converter's permute, one head
    assert np.array_equal(gguf_rows[:, 0], ggml_blocks.gguf_order(torch.from_numpy(w[:, 0].astype(np.float32))).numpy())
