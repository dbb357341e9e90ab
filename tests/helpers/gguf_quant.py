"""GGUF files of one model at other precisions, for llama-server peers: every tensor
dequantised and written again as F32, or quantised to Q8_0 / Q4_0 with the `gguf`
package's quantizer (`gguf.quants.quantize`, a reimplementation of ggml's reference
row quantizers `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref`, which llama-quantize
calls when it has no importance matrix).

Which tensors get which type follows llama-quantize's choice (llama.cpp's
`src/llama-quant.cpp`) for the tensors a llama model has:

- 1-D tensors and `*_norm.weight` stay F32 (it quantizes only 2-D+ `…weight` tensors,
  never norms);
- the output matrix — `output.weight`, or `token_embd.weight` when the embeddings are
  tied and there is no `output.weight` — is wanted as Q6_K unless the type is Q8_0, and
  falls back to Q8_0 when its row length is not a multiple of Q6_K's 256-element block
  (SmolLM2: 576), or to Q8_0 at once when the row is not a multiple of the type's own
  block;
- every other 2-D weight gets the file type (Q4_0 with no importance matrix keeps even
  the first ffn_down layers at Q4_0).

Only the types this needs are written; anything else is refused with a ValueError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers.gguf_tiny import rewrite_gguf

# GGUF `general.file_type` (llama_ftype) for the file types written here
FILE_TYPE = {"F32": 0, "Q8_0": 7, "Q4_0": 2}


def tensor_type(name: str, n_dims: int, row: int, file_type: str, tied: bool) -> Any:
    """The ggml type llama-quantize gives one tensor of a `file_type` file."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import GGML_QUANT_SIZES

    want = Q[file_type]
    if want == Q.F32 or n_dims < 2 or not name.endswith("weight") or "_norm.weight" in name:
        return Q.F32
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        if row % GGML_QUANT_SIZES[want][0] != 0 or want == Q.Q8_0:
            return Q.Q8_0
        # Q6_K is wanted; a row that is not whole 256-blocks falls back to Q8_0
        if row % GGML_QUANT_SIZES[Q.Q6_K][0] != 0:
            return Q.Q8_0
        raise ValueError(f"{name}: llama-quantize would write Q6_K, which this helper does not")
    if row % GGML_QUANT_SIZES[want][0] != 0:
        raise ValueError(f"{name}: row length {row} is not whole {file_type} blocks")
    return want


def write_gguf_at(src: Path, dst: Path, file_type: str) -> Path:
    """`src` (any llama GGUF) with every tensor dequantised to fp32 and, for Q8_0 / Q4_0,
    quantised again as llama-quantize would from fp32 weights. Metadata (tokenizer, chat
    template, hyper-parameters) is copied; `general.file_type` is set to the new type.
    Written to a sibling and renamed into place, so a half-written file never remains."""
    import gguf
    from gguf.quants import dequantize, quantize

    if file_type not in FILE_TYPE:
        raise ValueError(f"file type must be one of {', '.join(FILE_TYPE)}, got {file_type!r}")
    reader = gguf.GGUFReader(str(src))
    tied = "output.weight" not in {t.name for t in reader.tensors}
    out: list[tuple[str, np.ndarray, Any]] = []
    for t in reader.tensors:
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)  # [.., row]
        qtype = tensor_type(t.name, len(t.shape), int(w.shape[-1]), file_type, tied)
        out.append((t.name, np.ascontiguousarray(quantize(w, qtype)), qtype))
    return rewrite_gguf(reader, dst, out, {"general.file_type": FILE_TYPE[file_type]})


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each ggml type a GGUF holds (by type name)."""
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


# ----------------------------------------------------------------------------- llama-quantize itself
QUANTIZE_BUILD_SCRIPT = "benchmarks/build_llama_quantize.sh"


def find_llama_quantize() -> Path | None:
    """llama.cpp's own quantizer, built by benchmarks/build_llama_quantize.sh beside
    llama-server (newest version in the cache; SPECPROBE_LLAMA_QUANTIZE names one), or None."""
    from tests.helpers.llamacpp import find_built

    return find_built("llama-quantize", "SPECPROBE_LLAMA_QUANTIZE")


def llama_quantize(binary: Path, src: Path, dst: Path, file_type: str, threads: int = 2, extra: tuple[str, ...] = ()) -> Path:
    """`src` quantized to `file_type` (Q8_0, Q4_0, Q4_K_M, …) by llama-quantize with no
    importance matrix, written to a sibling and renamed into place. Raises RuntimeError
    with the tool's last lines when it fails."""
    import subprocess

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".part")
    cmd = [str(binary), *extra, str(src), str(tmp), file_type, str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True)  # noqa: S603
    if res.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama-quantize {file_type} failed ({res.returncode}):\n{(res.stdout + res.stderr)[-2000:]}")
    tmp.replace(dst)
    return dst


def tensor_bytes(path: Path) -> dict[str, tuple[str, bytes]]:
    """Each tensor of a GGUF as (ggml type name, its raw bytes)."""
    import gguf

    return {t.name: (t.tensor_type.name, bytes(np.ascontiguousarray(t.data).tobytes())) for t in gguf.GGUFReader(str(path)).tensors}


# ----------------------------------------------------------------------------- the server's text, replayed
def served_and_replayed(binary: Path, target: Path, drafter: Path, k: int, n_prompts: int, max_new: int, log: Path) -> dict[str, Any]:
    """llama-server drafting `n_prompts` builtin prompts, then specprobe replaying the
    server's own text with the same GGUF files (`benchmarks/bench_llamacpp_quant_peer`):
    the replay's record, once checked to count what the server counted. The same F32
    drafter on both sides: a near-tie argmax may tip one token on one request (summation
    order), no more."""
    from transformers import AutoTokenizer

    from benchmarks.bench_llamacpp_peer import encoded_prompts
    from benchmarks.bench_llamacpp_quant_peer import emitted_texts, replay, serve
    from specprobe.models.loader import checkpoint_dir, resolve

    prompts = encoded_prompts(n_prompts)
    lc = serve(binary, target, drafter, k, prompts, max_new, log)
    assert lc["drafted"] > 0 and lc["accepted"] > 0
    eos = int(AutoTokenizer.from_pretrained(str(checkpoint_dir(resolve("smollm2")))).eos_token_id)
    rep: dict[str, Any] = replay(target, drafter, prompts, emitted_texts(lc["outputs"], lc["stops"], eos), k, max_new)
    equal = sum(a == b for a, b in zip(rep["per_prompt"], lc["per_prompt"], strict=True))
    assert equal >= n_prompts - 1, (rep["per_prompt"], lc["per_prompt"])
    assert abs(rep["accepted"] - lc["accepted"]) <= 2 and abs(rep["drafted"] - lc["drafted"]) <= 4
    return rep
