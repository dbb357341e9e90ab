"""Peak memory of `diagnose` with the target served quantized: weights held quantized in
memory (precision/qlinear) against full precision and against the dequantize-everything code
this replaced.

The built-in SmolLM2-135M (float32 on the CPU) with its 24-layer self-draft, the first
`--prompts` built-in prompts × `--tokens` new tokens, nothing timed (--cost-ratio 0.5
--verify-factor 1), each run a fresh process; the peak RSS is the child's ru_maxrss.
Conditions (pick with --conditions):

  full        full precision: the built-in GGUF (Q4_1) through the fp32 path, dequantized
              once into a float32 checkpoint that every run loads (how every GGUF loaded
              before its layers were held as their blocks)
  held        the same GGUF held as its ggml blocks, dequantized per layer at each forward
              (precision/gguf_held: the default)
  q8_0, q4_k_m            SmolLM2-135M quantized by llama.cpp's own llama-quantize from its
                          F32 weights (benchmarks/build_llama_quantize.sh; skipped when it
                          is not built), held as their blocks
  q8_0-fp32, q4_k_m-fp32  the same files through the fp32 path
  int4, fp8   --target-quant (RTN), held quantized; the what-if swaps the original
              nn.Linear modules back in (one float copy of the weights, plus the packed one)
  int4-old    --target-quant int4 with the code before this change: the original float
              weights kept aside beside a dequantized float copy (two float copies)
  ckpt        a compressed-tensors pack-quantized W4A16 checkpoint of the same model
              (int4 RTN, groups of 64, written here in the format's layout: int32
              weight_packed, bf16 scales; embeddings and norms bf16), held as stored
  ckpt-old    the same checkpoint read by the code before this change (dequantized at load)

"old" runs the tree of commit --old (git archive into a temporary folder; nothing in the
repository changes). The references are generated once per condition (an untimed warm-up
run) and read from the disk cache by every measured run. Runs are interleaved A B C … per
repeat, every child with a cache folder of this run's own; printed: each condition's median peak RSS (min–max) and its ratio to full
precision, the wall time, the acceptance (the same in both code versions), and the model's
resident weight bytes (parameters and buffers) measured in this process.

Run: nice python benchmarks/bench_quant_memory.py [--repeats 2] [--old <commit>]
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CLI_CHILD  # benchmarks/common.py: run as a script, its folder is on the path

_CHILD = r"""
import dataclasses, os
if os.environ.get("BENCH_GGUF_FP32"):  # the fp32 path for a GGUF that would be held as its blocks
    import specprobe.precision.gguf_held as held
    _plan = held.held_plan
    held.held_plan = lambda path: dataclasses.replace(_plan(path), held=False, why="the fp32 path (benchmark)")
""" + CLI_CHILD

ROOT = Path(__file__).resolve().parents[1]
GROUP = 64  # the checkpoint's group size: SmolLM2's 576 input columns are no whole number of 128s, which vLLM's kernels require


QUANTIZED = ("q8_0", "q4_k_m")  # the llama-quantize files: condition -> its file type


def find_llama_quantize() -> Path | None:
    from tests.helpers.gguf_quant import find_llama_quantize as find

    return find()


def make_ggufs(folder: Path, which: list[str]) -> dict[str, Path]:
    """SmolLM2 by llama-quantize (no importance matrix) from its F32 weights, per condition."""
    binary = find_llama_quantize()
    if not which or binary is None:
        return {}
    from specprobe.models.loader import builtin_gguf_path
    from tests.helpers.gguf_quant import llama_quantize, write_gguf_at

    f32 = write_gguf_at(builtin_gguf_path("smollm2"), folder / "smollm2-F32.gguf", "F32")
    return {c: llama_quantize(binary, f32, folder / f"smollm2-{c}.gguf", c.upper()) for c in which}


def write_checkpoint(folder: Path) -> Path:
    """SmolLM2's decoder linears as a compressed-tensors pack-quantized W4A16 checkpoint:
    symmetric int4 RTN in groups of GROUP (specprobe.precision.quant.int_parts), each row's
    values stored as q + 8, eight input columns a little-endian int32 word."""
    import torch
    from safetensors.torch import save_file

    from specprobe.models.loader import load_info, load_model
    from specprobe.precision.qlinear import decoder_linears, float_layers
    from specprobe.precision.quant import int_parts

    info = load_info("smollm2")
    loaded = load_model("smollm2", device="cpu", dtype="float32", info=info)
    float_layers(loaded.model)  # the GGUF's layers as the fp32 path loads them
    linears = {f"model.{n}": m for n, m in decoder_linears(loaded.model)}
    state: dict[str, torch.Tensor] = {}
    for name, t in loaded.model.state_dict().items():
        prefix = name[: -len(".weight")]
        if prefix in linears:
            q, scale, _ = int_parts(t, 4, GROUP)
            u = (q.to(torch.int64) + 8).reshape(q.shape[0], -1, 8)
            words = sum(u[:, :, k] << (4 * k) for k in range(8))
            state[prefix + ".weight_packed"] = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
            state[prefix + ".weight_scale"] = scale.to(torch.bfloat16)
            state[prefix + ".weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int32)
        elif name == "lm_head.weight" and info.config.tie_word_embeddings:
            continue
        else:
            state[name] = t.to(torch.bfloat16) if t.is_floating_point() else t
    folder.mkdir(parents=True, exist_ok=True)
    for f in Path(info.path).iterdir():
        if f.suffix != ".safetensors" and f.name != "specprobe-cache.json":
            shutil.copy(f, folder / f.name)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP, "dynamic": False}, "input_activations": None}},
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def resident(ckpt: Path | None, ggufs: dict[str, Path]) -> dict[str, float]:
    """The weights' bytes in memory (MB) as each condition holds them, in this process."""
    import torch

    from specprobe.models.loader import load_model
    from specprobe.precision import qlinear, quant
    from specprobe.precision.qlinear import float_layers, weight_bytes

    out: dict[str, float] = {}
    for spec, name in [("smollm2", "held"), *((str(f), c) for c, f in ggufs.items())]:
        m = load_model(spec, device="cpu", dtype="float32")
        out[name] = weight_bytes(m.model) / 2**20
        float_layers(m.model)
        out["full" if name == "held" else f"{name}-fp32"] = weight_bytes(m.model) / 2**20
        del m
    for cond in ("full", "int4", "fp8"):
        m = load_model("smollm2", device="cpu", dtype="float32")
        if cond == "full":
            float_layers(m.model)
        if cond != "full":
            q = quant.serve_quantized(m, cond, keep=True)
            extra = sum(weight_bytes(o) for o in q.originals.values())  # the originals the what-if swaps back in
            out[cond + " (quantized alone)"] = weight_bytes(m.model) / 2**20
            out[cond] = (weight_bytes(m.model) + extra) / 2**20
        else:
            linear = sum(mod.weight.numel() * 4 for _, mod in qlinear.decoder_linears(m.model))
            out["int4-old"] = (weight_bytes(m.model) + linear) / 2**20  # the originals beside a dequantized float copy
        del m
    if ckpt is not None:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(ckpt)
        held, _ = quant.load_quantized_checkpoint(ckpt, cfg, torch.float32)
        out["ckpt"] = weight_bytes(held) / 2**20
        ref, _ = quant.load_quantized_checkpoint(ckpt, cfg, torch.float32, in_memory=False)
        out["ckpt-old"] = weight_bytes(ref) / 2**20
    return out


def run(cond: str, ckpt: Path, old: Path, out: Path, prompts: int, tokens: int, ggufs: dict[str, Path]) -> dict:
    out.unlink(missing_ok=True)
    file = cond.removesuffix("-fp32")
    target = str(ckpt) if cond.startswith("ckpt") else str(ggufs[file]) if file in ggufs else "smollm2"
    args = ["diagnose", target, "self:layers=24", "--max-prompts", str(prompts), "--max-new-tokens", str(tokens), "--device", "cpu",
            "--cost-ratio", "0.5", "--verify-factor", "1", "--json", str(out), "--fail-on", "never"]  # fmt: skip
    if cond in ("int4", "int4-old", "fp8"):
        args += ["--target-quant", cond.split("-")[0]]
    cwd = old if cond.endswith("-old") else ROOT
    fp32 = {"BENCH_GGUF_FP32": "1"} if cond == "full" or cond.endswith("-fp32") else {}
    if not cond.endswith("-old"):  # a GGUF's weights as the condition says (--gguf-weights auto would pick floats for a model this small)
        args += ["--gguf-weights", "float" if fp32 else "held"]
    p = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, cwd=cwd, env={**os.environ, "COLUMNS": "200", **fp32})
    line = next((x for x in p.stdout.splitlines()[::-1] if x.startswith("BENCH ")), None)
    if line is None or not out.exists() or p.returncode:
        raise SystemExit(f"diagnose ({cond}) failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    m = json.loads(line[6:])
    r = json.loads(out.read_text())
    mets = r.get("metrics") or {}
    m["alpha"] = mets.get("accept_prob_mean")
    return m


def med(xs: list[float], f: str = ".0f") -> str:
    return f"{statistics.median(xs):{f}} ({min(xs):{f}}–{max(xs):{f}})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds of every condition")
    ap.add_argument("--conditions", default="full,held,int4,int4-old,fp8,ckpt,ckpt-old,q8_0,q8_0-fp32,q4_k_m,q4_k_m-fp32")
    ap.add_argument("--old", default="0378449~1", help="the commit before weights were held quantized")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--helper", help=argparse.SUPPRESS)  # internal: write the checkpoint there, print the sizes
    a = ap.parse_args()
    if a.helper:
        folder = Path(a.helper)
        ggufs = make_ggufs(folder, [c for c in os.environ.get("BENCH_GGUFS", "").split(",") if c])
        print(json.dumps(resident(write_checkpoint(folder / "smollm2-w4a16"), ggufs)))
        return
    conds = a.conditions.split(",")
    if find_llama_quantize() is None and any(c.removesuffix("-fp32") in QUANTIZED for c in conds):
        print("llama-quantize is not built (benchmarks/build_llama_quantize.sh): the q8_0 / q4_k_m conditions are left out")
        conds = [c for c in conds if c.removesuffix("-fp32") not in QUANTIZED]
    print(f"SmolLM2-135M (float32 compute, CPU) + self:layers=24 on {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {a.prompts} prompts × {a.tokens} tokens, nothing timed; {a.repeats} interleaved round(s); old = {a.old}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["SPECPROBE_CACHE_DIR"] = str(folder / "cache")  # every child's: the fp32 entries of the files made here go with them
        old = folder / "old"
        old.mkdir()
        subprocess.run(f"git -C {ROOT} archive {a.old} specprobe rules | tar -x -C {old}", shell=True, check=True)
        ckpt = folder / "smollm2-w4a16"
        which = [c for c in QUANTIZED if c in conds or f"{c}-fp32" in conds]
        # the GGUFs, the checkpoint and the weights' sizes in a child of their own: this
        # process stays small, as a child's peak RSS starts from its parent's at the fork
        helper = subprocess.run([sys.executable, __file__, "--helper", str(folder)], capture_output=True, text=True, cwd=ROOT, env={**os.environ, "BENCH_GGUFS": ",".join(which)})
        if helper.returncode:
            raise SystemExit(f"writing the checkpoint failed:\n{helper.stderr[-2000:]}")
        sizes = json.loads(helper.stdout.splitlines()[-1])
        ggufs = {c: folder / f"smollm2-{c}.gguf" for c in which}
        for c in conds:
            run(c, ckpt, old, folder / f"warm-{c}.json", a.prompts, a.tokens, ggufs)  # references into the disk cache
        res: dict[str, list[dict]] = {c: [] for c in conds}
        for i in range(a.repeats):
            for c in conds:
                res[c].append(run(c, ckpt, old, folder / f"{c}{i}.json", a.prompts, a.tokens, ggufs))
    base = statistics.median(x["rss_mb"] for x in res["full"]) if "full" in res else None
    print(f"\n{'condition':<10} {'peak RSS MB':>20} {'÷ full':>7} {'wall s':>18} {'α':>7} {'weights MB':>11}")
    for c in conds:
        rss = [x["rss_mb"] for x in res[c]]
        ratio = f"{statistics.median(rss) / base:.2f}" if base else "—"
        alpha = res[c][-1]["alpha"]
        print(f"{c:<10} {med(rss):>20} {ratio:>7} {med([x['wall_s'] for x in res[c]], '.1f'):>18} {alpha if alpha is None else round(alpha, 4)!s:>7} {sizes.get(c, float('nan')):>11.0f}")
    for k, v in sizes.items():
        if "alone" in k:
            print(f"  {k}: {v:.0f} MB of weights (without the originals kept for the what-if)")
    print(f"\nload after: {os.getloadavg()[0]:.1f}; finished {time.strftime('%H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()
