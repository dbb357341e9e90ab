"""llama.cpp's own quantizer as the peer: SmolLM2-135M's F32 weights quantized by the
real `llama-quantize` (benchmarks/build_llama_quantize.sh, the same vendored llama.cpp as
llama-server) against the same weights quantized by the `gguf` package's reference
quantizer (tests/helpers/gguf_quant.py), tensor by tensor, byte for byte; and the most
served K-quant, Q4_K_M, which only llama-quantize makes here: specprobe loads it as its
bytes dequantize, and on the text llama-server emits with it specprobe's drafter accepts
what the server counts.

Every test here skips, with the reason, when llama-quantize is not built (it is not part
of .ci/run: CI's time goes to llama-server); the server test also needs llama-server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import requires_smollm2
from tests.helpers.gguf_quant import QUANTIZE_BUILD_SCRIPT, find_llama_quantize
from tests.helpers.llamacpp import BUILD_SCRIPT, find_llama_server

QUANTIZE = find_llama_quantize()
SERVER = find_llama_server()
K, LAYERS, MAX_NEW, N_PROMPTS = 4, 28, 32, 3

needs_quantize = pytest.mark.skipif(QUANTIZE is None, reason=f"llama-quantize is not built (run {QUANTIZE_BUILD_SCRIPT}; not part of .ci/run)")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llama-quantize")


@pytest.fixture(scope="module")
def f32(work: Path) -> Path:
    from specprobe.models.loader import builtin_gguf_path
    from tests.helpers.gguf_quant import write_gguf_at

    return write_gguf_at(builtin_gguf_path("smollm2"), work / "smollm2-F32.gguf", "F32")


def _by_both(work: Path, f32: Path, file_type: str) -> tuple[dict[str, tuple[str, bytes]], dict[str, tuple[str, bytes]]]:
    from specprobe.models.loader import builtin_gguf_path
    from tests.helpers.gguf_quant import llama_quantize, tensor_bytes, write_gguf_at

    assert QUANTIZE is not None
    theirs = llama_quantize(QUANTIZE, f32, work / f"lq-{file_type}.gguf", file_type)
    ours = write_gguf_at(builtin_gguf_path("smollm2"), work / f"py-{file_type}.gguf", file_type)
    return tensor_bytes(theirs), tensor_bytes(ours)


@pytest.mark.slow
@requires_smollm2
@needs_quantize
@pytest.mark.parametrize("file_type", ["Q8_0", "Q4_0"])
def test_reference_quantizer_writes_llama_quantizes_bytes(work: Path, f32: Path, file_type: str) -> None:
    theirs, ours = _by_both(work, f32, file_type)
    assert set(theirs) == set(ours)
    types = {n: t for n, (t, _) in theirs.items()}
    assert types == {n: t for n, (t, _) in ours.items()}, "the helper picks each tensor's type as llama-quantize does"
    assert types["token_embd.weight"] == "Q8_0"  # the tied output matrix: Q6_K wanted, 576 is not whole 256-blocks
    differ = sorted(n for n in theirs if theirs[n][1] != ours[n][1])
    assert differ == [], f"{len(differ)} tensors differ, e.g. {differ[:5]}"


@pytest.fixture(scope="module")
def q4_k_m(work: Path, f32: Path) -> Path:
    from tests.helpers.gguf_quant import llama_quantize

    assert QUANTIZE is not None
    return llama_quantize(QUANTIZE, f32, work / "smollm2-Q4_K_M.gguf", "Q4_K_M")


@pytest.mark.slow
@requires_smollm2
@needs_quantize
def test_q4_k_m_is_loaded_as_its_bytes_dequantize(q4_k_m: Path) -> None:
    """Q4_K_M as llama-quantize makes it of SmolLM2-135M: the K-quants need rows of whole
    256-blocks and most of this model's matrices have 576 columns, so llama.cpp's fallback
    turns them into Q5_0 (for Q4_K) and Q8_0 (for Q6_K, and the tied output matrix); only
    ffn_down (1,536 columns) is a K-quant — Q6_K on the layers use_more_bits picks, Q4_K on
    the rest. specprobe's weights are gguf's dequantization of each tensor's bytes
    (ggml's dequantize_row_q5_0 / q4_K / q6_K)."""
    import gguf
    import torch

    from specprobe.models.loader import load_model
    from tests.helpers.gguf_quant import tensor_types

    assert tensor_types(q4_k_m) == {"F32": 61, "Q5_0": 166, "Q8_0": 15, "Q4_K": 16, "Q6_K": 14}
    tensors = {t.name: t for t in gguf.GGUFReader(str(q4_k_m)).tensors}
    layers = load_model(str(q4_k_m), device="cpu", dtype="float32", gguf_weights="held").model.model.layers
    for name, mod, kind in (
        ("blk.0.ffn_up.weight", layers[0].mlp.up_proj, "Q5_0"),  # 576 columns: Q4_K falls back
        ("blk.0.ffn_down.weight", layers[0].mlp.down_proj, "Q6_K"),  # the first layers get more bits
        ("blk.3.ffn_down.weight", layers[3].mlp.down_proj, "Q4_K"),
    ):
        t = tensors[name]
        assert t.tensor_type.name == kind, (name, t.tensor_type.name)
        want = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        got = mod.weight_float()  # held as its blocks (precision.gguf_held), read back
        assert torch.equal(got, torch.from_numpy(want.reshape(got.shape))), name


@pytest.mark.slow
@pytest.mark.engine
@requires_smollm2
@needs_quantize
@pytest.mark.skipif(SERVER is None, reason=f"llama-server is not built (run {BUILD_SCRIPT}; .ci/run does)")
def test_q4_k_m_target_on_the_servers_text(q4_k_m: Path, work: Path, tmp_path: Path) -> None:
    from benchmarks.bench_llamacpp_quant_peer import make_files
    from tests.helpers.gguf_quant import served_and_replayed

    assert SERVER is not None
    _, drafter = make_files(work, [], LAYERS)
    rep = served_and_replayed(SERVER, q4_k_m, drafter, K, N_PROMPTS, MAX_NEW, tmp_path / "server.log")
    assert rep["target_agree"] >= 0.85  # specprobe's Q4_K_M target (fp32 activations) vs the server's (Q4_K × Q8_K)
