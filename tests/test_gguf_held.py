"""A GGUF held as its ggml blocks (specprobe.precision.gguf_held): against the fp32 path
(transformers' GGUF loader dequantizing every tensor, saved and loaded as a float
checkpoint) on a tiny llama GGUF written with GGUFWriter, weight for weight and logit for
logit, bit for bit; the bytes the model holds are the file's blocks, the q/k rows in the
order transformers' reversal of llama.cpp's permutation puts them; the per-layer
dequantizer against the `gguf` package's for every type; the fp32 path where a file
cannot be held; and, where llama-quantize is built, SmolLM2 at Q8_0 and Q4_K_M."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import requires_smollm2
from tests.helpers.gguf_quant import find_llama_quantize
from tests.helpers.gguf_tiny import HEADS, KV_HEADS, write_tiny_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUANTIZE = find_llama_quantize()
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4"]  # fmt: skip


@pytest.fixture(autouse=True)
def _hold_what_can_be_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """--gguf-weights auto holds a GGUF only when its fp32 weights would not fit; these
    tests are about the held path, so nothing fits."""
    from specprobe.models import loader

    monkeypatch.setattr(loader, "GGUF_FIT_SHARE", 0.0)


@pytest.mark.parametrize("name", TYPES)
def test_per_layer_dequantizer_is_ggufs_bit_for_bit(name: str) -> None:
    """Random bytes as rows of `name` blocks (every bit pattern: scales that are inf or NaN
    too): the per-forward dequantizer gives the values transformers' loader computes with
    gguf.quants.dequantize, NaN where it has NaN."""
    from gguf import GGMLQuantizationType
    from gguf.quants import GGML_QUANT_SIZES, dequantize

    from specprobe.precision.ggml_blocks import dequantize_ggml, ggml_readable

    qtype = GGMLQuantizationType[name]
    elems, size = GGML_QUANT_SIZES[qtype]
    rows, cols = 6, elems * 3
    raw = np.random.default_rng(len(name)).integers(0, 256, size=(rows, cols // elems * size), dtype=np.uint8)
    want = torch.from_numpy(np.asarray(dequantize(raw, qtype), dtype=np.float32))
    got = dequantize_ggml(torch.from_numpy(raw), name, rows, cols)
    assert ggml_readable(name)
    assert got.dtype == torch.float32 and got.shape == (rows, cols)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert torch.equal(got[finite], want[finite])


def _fp32_reference(path: Path, dtype: torch.dtype) -> Any:
    """Today's fp32 path: transformers' GGUF loader, saved as a float checkpoint, loaded."""
    from transformers import AutoModelForCausalLM

    from specprobe.models.loader import ensure_gguf_cached

    return AutoModelForCausalLM.from_pretrained(str(ensure_gguf_cached(path)), dtype=dtype, local_files_only=True).eval()


def _permutation(rows: int, heads: int) -> np.ndarray:
    """The row order transformers' LlamaTensorProcessor gives a q (heads) or k (KV heads) weight."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    proc = LlamaTensorProcessor(config={"num_attention_heads": HEADS, "num_key_value_heads": heads})
    name = "blk.0.attn_q.weight" if heads == HEADS else "blk.0.attn_k.weight"
    return np.asarray(proc.process(np.arange(rows), name).weights)


@pytest.mark.parametrize(("linear", "dtype"), [("Q8_0", torch.float32), ("Q4_0", torch.float32), ("Q4_1", torch.float32), ("Q5_1", torch.float32), ("Q8_0", torch.bfloat16)])
def test_held_gguf_is_the_fp32_path_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linear: str, dtype: torch.dtype) -> None:
    import gguf

    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))  # this test's own: no fp32 entry from another

    from specprobe.models.loader import cache_root, load_info, load_model
    from specprobe.precision.qlinear import QuantLinear, quant_linears, weight_bytes

    path = write_tiny_gguf(tmp_path / f"tiny-{linear}.gguf", linear)
    info = load_info(str(path))
    assert info.extra["gguf_held"] and not (info.path / "model.safetensors").exists()
    loaded = load_model(str(path), "cpu", "float32" if dtype == torch.float32 else "bfloat16", info=info)
    assert not (cache_root() / "gguf").exists(), "the fp32 checkpoint was made"
    held = dict(quant_linears(loaded.model))
    assert len(held) == 2 * 7 and all(m.form == "ggml" and m.meta["type"] == linear for m in held.values())
    record = loaded.checkpoint_quant
    assert record["weights"] == linear and record["method"] == "checkpoint" and record["layers"] == 14 and "ggml blocks" in record["note"]

    # the bytes it holds are the file's blocks: q and k rows in transformers' order
    file = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(path)).tensors}
    layer0 = loaded.model.model.layers[0]
    for gguf_name, mod, perm in (
        ("blk.0.attn_q.weight", layer0.self_attn.q_proj, _permutation(64, HEADS)),
        ("blk.0.attn_k.weight", layer0.self_attn.k_proj, _permutation(32, KV_HEADS)),
        ("blk.0.attn_v.weight", layer0.self_attn.v_proj, None),
        ("blk.0.ffn_down.weight", layer0.mlp.down_proj, None),
    ):
        assert isinstance(mod, QuantLinear)
        rows = file[gguf_name] if perm is None else file[gguf_name][perm]
        assert torch.equal(mod.parts()["blocks"], torch.from_numpy(np.array(rows, copy=True))), gguf_name
        assert mod.stored_bytes() == file[gguf_name].nbytes
    assert sorted(_permutation(64, HEADS).tolist()) == list(range(64)) and _permutation(64, HEADS).tolist() != list(range(64))

    ref = _fp32_reference(path, dtype)
    want = ref.state_dict()
    for name, mod in held.items():
        assert torch.equal(mod.weight_float(), want[name + ".weight"]), name
    mine = loaded.model.state_dict()
    for name, t in want.items():
        if name.rpartition(".")[0] not in held:
            assert torch.equal(mine[name], t), name
    assert weight_bytes(loaded.model) < weight_bytes(ref)
    assert loaded.params == sum(p.numel() for p in ref.parameters())
    ids = torch.tensor([[5, 70, 100, 3, 200, 17, 9, 44], [8, 9, 10, 11, 12, 13, 14, 15]])
    with torch.inference_mode():
        assert torch.equal(loaded.model(ids).logits, ref(ids).logits)


def test_float_gguf_loads_without_the_fp32_checkpoint(tmp_path: Path) -> None:
    """An F16 file: read from the file too (no layer held: its weights are floats, cast at
    load), the fp32 path's values."""
    from specprobe.models.loader import load_model
    from specprobe.precision.qlinear import quant_linears

    path = write_tiny_gguf(tmp_path / "tiny-F16.gguf", "F16", embed_type="F16")
    loaded = load_model(str(path), "cpu", "float32")
    assert loaded.info.extra["gguf_held"] and not list(quant_linears(loaded.model))
    assert getattr(loaded, "checkpoint_quant", None) is None  # --target-quant still simulates on it
    ref = _fp32_reference(path, torch.float32)
    want = ref.state_dict()
    for name, t in loaded.model.state_dict().items():
        assert torch.equal(t, want[name]), name
    ids = torch.tensor([[5, 70, 100, 3, 200, 17, 9, 44]])
    with torch.inference_mode():
        assert torch.equal(loaded.model(ids).logits, ref(ids).logits)


def test_float_state_dict_is_the_fp32_checkpoints(tmp_path: Path) -> None:
    """What a consumer that writes weights reads (the demo's vocab-shuffled twin): each
    held layer as its float weight, every key the fp32 checkpoint has."""
    from specprobe.models.loader import load_model
    from specprobe.precision.qlinear import float_state_dict

    path = write_tiny_gguf(tmp_path / "tiny-Q4_0.gguf", "Q4_0")
    state = float_state_dict(load_model(str(path), "cpu", "float32").model)
    want = _fp32_reference(path, torch.float32).state_dict()
    assert set(state) == set(want)
    assert all(torch.equal(state[k], want[k]) for k in want)


def test_an_architecture_it_cannot_hold_takes_the_fp32_path_with_a_note(tmp_path: Path) -> None:
    """gemma2's tensor processor offsets norms: the plan says so in one line, and which path."""
    import gguf
    from gguf.quants import quantize

    from specprobe.precision.gguf_held import held_plan

    path = tmp_path / "g.gguf"
    w = gguf.GGUFWriter(str(path), arch="gemma2")
    w.add_block_count(1)
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", quantize(x, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    plan = held_plan(path)
    assert not plan.held and plan.types == ("Q8_0",)
    assert "Gemma2TensorProcessor" in plan.why and "dequantized to fp32" in plan.why and "\n" not in plan.why


def test_diagnose_says_the_target_is_held_and_simulates_on_its_float_weights(tmp_path: Path) -> None:
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.report.console import _served_line
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags

    path = write_tiny_gguf(tmp_path / "tiny-Q8_0.gguf", "Q8_0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": "hello world {i}"}}\n' for i in range(3)))
    cfg = DiagnoseConfig(target=str(path), drafter="self:layers=1", prompts=str(prompts), max_new_tokens=6, batch_size=3, k_max=3, cost_ratio=0.1, sampling=SamplingFlags(temperature=0.0))
    result = run_diagnose(cfg)
    q = result.target.quant
    assert q is not None and q.weights == "Q8_0" and q.method == "checkpoint" and q.layers == 14
    assert result.drafter.quant is not None and result.drafter.quant.shared_with_target
    line = _served_line(q, result.drafter.quant)
    assert line is not None and "as the file stores them" in line and "round-to-nearest" not in line
    from dataclasses import replace

    # --target-quant on a GGUF: simulated on its dequantized weights (the fp32 path's values),
    # with the full-precision what-if against those
    sim = run_diagnose(replace(cfg, target_quant="int8"))
    assert sim.target.quant is not None and sim.target.quant.weights == "int8" and sim.target.quant.method == "rtn"
    assert sim.metrics.get("target_quant_accept") is not None


def test_a_simulated_scheme_on_a_held_gguf_quantizes_the_fp32_paths_weights(tmp_path: Path) -> None:
    from specprobe.models.loader import load_model
    from specprobe.precision import quant
    from specprobe.precision.qlinear import quant_linears

    path = write_tiny_gguf(tmp_path / "tiny-Q4_0.gguf", "Q4_0")
    loaded = load_model(str(path), "cpu", "float32")
    want = _fp32_reference(path, torch.float32).state_dict()
    done = quant.serve_quantized(loaded, "int8", keep=True)
    assert getattr(loaded, "checkpoint_quant", None) is None and len(done.layers) == 14
    assert all(m.form == "int" for _, m in quant_linears(loaded.model))
    for name, orig in done.originals.items():
        assert torch.equal(orig.weight, want[f"model.{name}.weight"]), name  # the fp32 path's float weights


# ----------------------------------------------------------------------------- SmolLM2 by llama-quantize
@pytest.fixture(scope="module")
def smollm2_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specprobe.models.loader import builtin_gguf_path
    from tests.helpers.gguf_quant import write_gguf_at

    return write_gguf_at(builtin_gguf_path("smollm2"), tmp_path_factory.mktemp("lq") / "smollm2-F32.gguf", "F32")


@pytest.mark.slow
@requires_smollm2
@pytest.mark.skipif(QUANTIZE is None, reason="llama-quantize is not built (run benchmarks/build_llama_quantize.sh)")
@pytest.mark.parametrize("file_type", ["Q8_0", "Q4_K_M"])
def test_smollm2_by_llama_quantize_held_is_the_fp32_path(smollm2_f32: Path, file_type: str) -> None:
    from specprobe.models.loader import load_model
    from specprobe.precision.qlinear import quant_linears
    from tests.helpers.gguf_quant import llama_quantize

    assert QUANTIZE is not None
    path = llama_quantize(QUANTIZE, smollm2_f32, smollm2_f32.with_name(f"smollm2-{file_type}.gguf"), file_type)
    loaded = load_model(str(path), "cpu", "float32")
    held = dict(quant_linears(loaded.model))
    assert len(held) == 30 * 7
    if file_type == "Q4_K_M":  # K-quants on ffn_down, Q5_0 where rows are not whole 256-blocks
        assert {"Q4_K", "Q6_K", "Q5_0"} <= {m.meta["type"] for m in held.values()}
    assert loaded.checkpoint_quant["weights"] == file_type  # the file's type names a mix
    ref = _fp32_reference(path, torch.float32)
    want = ref.state_dict()
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.3.mlp.down_proj", "model.layers.29.self_attn.k_proj"):
        assert torch.equal(held[name].weight_float(), want[name + ".weight"]), name
    ids = loaded.tokenizer(["The capital of France is", "def fib(n):"], return_tensors="pt", padding=True)
    with torch.inference_mode():
        a = loaded.model(**ids).logits
        b = ref(**ids).logits
    assert torch.equal(a, b)


def test_spread_over_devices_loads_the_fp32_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--device-map: accelerate spreads a float checkpoint, so a held GGUF goes the fp32 way
    (said in a line), with the same logits."""
    from specprobe.models.loader import cache_root, load_model
    from specprobe.precision.qlinear import quant_linears

    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))
    path = write_tiny_gguf(tmp_path / "tiny-Q8_0.gguf", "Q8_0")
    notes: list[str] = []
    spread = load_model(str(path), "cpu", "float32", progress=notes.append, device_map="cpu")
    held = load_model(str(path), "cpu", "float32")
    assert not list(quant_linears(spread.model)) and any((cache_root() / "gguf").glob("tiny-Q8_0-*"))
    assert any("fp32 checkpoint" in n for n in notes)
    ids = torch.tensor([[5, 70, 100, 3, 200, 17, 9, 44]])
    with torch.inference_mode():
        assert torch.equal(spread.model(ids).logits, held.model(ids).logits)


def test_gguf_weights_auto_holds_only_what_would_not_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--gguf-weights: auto takes the fp32 path for a GGUF whose fp32 weights fit in half
    the memory available (a held layer is dequantized at every forward, which costs time)
    and holds it as its blocks when they would not; held and float say which; a file of
    floats only is read directly either way."""
    from specprobe.models import loader
    from specprobe.precision.gguf_held import held_plan

    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "GGUF_FIT_SHARE", 0.5)
    path = write_tiny_gguf(tmp_path / "tiny-Q8_0.gguf", "Q8_0")
    plan = held_plan(path)
    assert plan.held and plan.float_bytes > 0
    notes: list[str] = []
    assert loader.load_info(str(path), notes.append).extra["gguf_held"] is False  # a tiny model fits
    assert any("dequantized to fp32" in n and "--gguf-weights held" in n for n in notes)
    assert loader.load_info(str(path), gguf_weights="held").extra["gguf_held"] is True
    assert loader.load_info(str(path), gguf_weights="float").extra["gguf_held"] is False
    monkeypatch.setattr(loader, "available_memory", lambda: plan.float_bytes)  # twice the share: does not fit
    assert loader.load_info(str(path)).extra["gguf_held"] is True
    monkeypatch.setattr(loader, "available_memory", lambda: None)  # unknown: hold
    assert loader.load_info(str(path)).extra["gguf_held"] is True
    monkeypatch.setattr(loader, "available_memory", lambda: 1 << 40)
    f16 = write_tiny_gguf(tmp_path / "tiny-F16.gguf", "F16", embed_type="F16")
    assert loader.load_info(str(f16)).extra["gguf_held"] is True  # floats only: read directly


def test_one_parse_of_the_file_writes_what_transformers_writes_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fp32 path with each GGUF parsed once (`loader.parsed_once`): the header is read
    once, not three times, the `gguf` package is as it was afterwards, and the checkpoint
    is transformers' own, tensor by tensor and file by file."""
    import contextlib

    import gguf
    from safetensors.torch import load_file

    from specprobe.models import loader

    path = write_tiny_gguf(tmp_path / "tiny.gguf", linear_type="Q4_1", embed_type="Q8_0")
    made: list[str] = []

    class Counted(gguf.GGUFReader):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(str(args[0]))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    name_map = gguf.get_tensor_name_map
    once, alone = tmp_path / "once", tmp_path / "alone"
    loader._dequantise_into(path, once)
    assert len(made) == 1, made
    assert gguf.GGUFReader is Counted and gguf.get_tensor_name_map is name_map
    monkeypatch.setattr(loader, "parsed_once", contextlib.nullcontext)
    loader._dequantise_into(path, alone)
    assert len(made) == 4, made  # config, tokenizer and weights each parse it again
    a, b = load_file(once / "model.safetensors"), load_file(alone / "model.safetensors")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    files = sorted(p.name for p in alone.iterdir())
    assert files == sorted(p.name for p in once.iterdir()) and "tokenizer.json" in files
    for name in files:
        if name != "model.safetensors":
            assert (once / name).read_bytes() == (alone / name).read_bytes(), name
