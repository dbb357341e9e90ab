"""Benchmark `simulate` against transformers' assisted generation on SmolLM2-135M (CPU).

1. Throughput. Greedy, constant K, a layer-skip self-draft (first N of 30 layers): the
   peer is `generate(assistant_early_exit=N, num_assistant_tokens=K,
   num_assistant_tokens_schedule="constant")`, run prompt by prompt (it only supports
   batch 1). Prints simulate tokens/s ÷ assisted-generation tokens/s at --batch-size 1
   and 8 on the same prompts, K and device, plus plain decoding for context.
2. Peer agreement. τ = generated tokens ÷ target forward calls for both (the hook counts
   only full-depth calls, since the early-exit assistant is the same module).
3. Calibration. Teacher-forced estimate vs measured τ at temperature 0.7, K=4, for the
   28- and 24-layer self-drafts over the same prompts (`run_simulate`).

Prints ratios; asserts nothing. Run: python benchmarks/bench_simulate.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch


def encode_prompts(tok: Any, n: int) -> list[list[int]]:
    from specprobe.probe.references import encode_prompt
    from specprobe.prompts import builtin_suite, select

    ps = select(builtin_suite(), max_prompts=n)
    return [encode_prompt(tok, p) for p in ps.prompts]


def hf_assisted(model: Any, prompts: list[list[int]], k: int, layers: int, max_new: int) -> dict[str, float]:
    """Assisted generation prompt by prompt; tokens/s and τ = tokens ÷ target calls."""
    base = model.model
    full = base.config.num_hidden_layers
    calls = {"target": 0}

    def hook(*_: Any) -> None:
        if base.config.num_hidden_layers == full:  # the early-exit assistant runs with fewer
            calls["target"] += 1

    gc = model.generation_config
    saved = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold)
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = k, "constant", 0.0
    h = model.register_forward_hook(hook)
    tokens, outs = 0, []
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p])
                out = model.generate(
                    ids, attention_mask=torch.ones_like(ids), assistant_early_exit=layers, num_assistant_tokens=k,
                    num_assistant_tokens_schedule="constant", do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new,
                    eos_token_id=None, pad_token_id=0,
                )
                outs.append(out[0, len(p) :].tolist())
                tokens += out.shape[1] - len(p)
    finally:
        h.remove()
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = saved
    wall = time.perf_counter() - t0
    return {"tokens_per_s": tokens / wall, "tau": tokens / calls["target"], "wall_s": wall, "outputs": outs}  # type: ignore[dict-item]


def hf_plain(model: Any, prompts: list[list[int]], max_new: int) -> float:
    tokens = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new, eos_token_id=None, pad_token_id=0)
            tokens += out.shape[1] - len(p)
    return tokens / (time.perf_counter() - t0)


def ours(target: Any, step: Any, prompts: list[list[int]], k: int, max_new: int, batch: int) -> Any:
    from specprobe.metrics.sampling import Sampling
    from specprobe.simulate import speculate

    # no EOS: every prompt generates max_new tokens, as in the peer run
    return speculate(target, step, prompts, k=k, target_sampling=Sampling(0.0), max_new_tokens=max_new, batch_size=batch)


def calibration(layers: int, n_prompts: int, max_new: int, k: int) -> dict[str, float]:
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags, SimulateConfig
    from specprobe.simulate import run_simulate

    d = DiagnoseConfig(
        target="smollm2", drafter=f"self:layers={layers}", max_prompts=n_prompts, max_new_tokens=max_new,
        sampling=SamplingFlags(temperature=0.7), batch_size=8, k_max=8, device="cpu", dtype="float32", keep_positions=False,
    )
    r = run_simulate(SimulateConfig(d, ks=[k], baseline=False))
    m, meas = r.metrics, r.measured
    assert meas is not None and meas.depth is not None and r.depth is not None
    row = meas.k_table[0]
    return {
        "alpha": m["accept_prob_mean"], "tau_est": row.tau_estimate, "tau_meas": row.tau_tokens, "gap_rel": m["tau_gap_rel"],
        "drafts": row.num_drafts, "accept_meas": row.accept_rate,
        "cum_est": r.depth.cumulative[:k], "cum_meas": meas.depth.cumulative,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--layers", type=int, default=28, help="layer-skip drafter depth for the throughput part")
    ap.add_argument("--repeats", type=int, default=2, help="best of N for each timing (a shared CPU is noisy)")
    ap.add_argument("--calib-prompts", type=int, default=16)
    ap.add_argument("--calib-tokens", type=int, default=48)
    ap.add_argument("--quick", action="store_true", help="4 prompts, 16 tokens, 1 repeat, 8 calibration prompts")
    ap.add_argument("--skip-calibration", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.prompts, a.max_new_tokens, a.repeats, a.calib_prompts, a.calib_tokens = 4, 16, 1, 8, 32

    from specprobe.models.drafters import build_drafter
    from specprobe.models.loader import load_model

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    tm = load_model("smollm2", "cpu", "float32")
    step = build_drafter(f"self:layers={a.layers}", tm).step_model()
    prompts = encode_prompts(tm.tokenizer, a.prompts)
    print(f"SmolLM2-135M target, self-draft first {a.layers}/30 layers, greedy, K={a.k}, {len(prompts)} prompts × {a.max_new_tokens} tokens")

    hf, s1, s8, p1, p8, hp = [], [], [], [], [], []
    peer = None
    for _ in range(a.repeats):
        # interleaved, so drift on a shared machine hits every side alike
        peer = hf_assisted(tm.model, prompts, a.k, a.layers, a.max_new_tokens)
        hf.append(peer["tokens_per_s"])
        r1 = ours(tm.model, step, prompts, a.k, a.max_new_tokens, 1)
        s1.append(r1.counters.tokens_per_s)
        r8 = ours(tm.model, step, prompts, a.k, a.max_new_tokens, 8)
        s8.append(r8.counters.tokens_per_s)
        p1.append(ours(tm.model, None, prompts, 0, a.max_new_tokens, 1).counters.tokens_per_s)
        p8.append(ours(tm.model, None, prompts, 0, a.max_new_tokens, 8).counters.tokens_per_s)
        hp.append(hf_plain(tm.model, prompts, a.max_new_tokens))
    best = max
    print(f"\n== throughput (tokens/s, best of {a.repeats}) ==")
    print(f"transformers assisted generation (early exit {a.layers}, batch 1): {best(hf):7.2f}")
    print(f"specprobe simulate --batch-size 1:                            {best(s1):7.2f}   ratio {best(s1) / best(hf):5.2f}×  (target ≥ 1.0)")
    print(f"specprobe simulate --batch-size 8:                            {best(s8):7.2f}   ratio {best(s8) / best(hf):5.2f}×  (target ≥ 2)")
    print(f"plain decoding: transformers generate b1 {best(hp):.2f}, specprobe loop b1 {best(p1):.2f}, b8 {best(p8):.2f}")
    print(f"speedup vs plain decoding (same loop, same batch): b1 {best(s1) / best(p1):.2f}×, b8 {best(s8) / best(p8):.2f}×")
    assert peer is not None
    same = peer["outputs"] == r1.outputs
    print("\n== peer agreement (greedy, constant K) ==")
    print(f"τ transformers = generated ÷ target calls = {peer['tau']:.3f};  τ specprobe = emitted ÷ verify steps = {r1.counters.tokens_per_verify:.3f}"
          f"  (gap {100 * (r1.counters.tokens_per_verify - peer['tau']) / peer['tau']:+.1f}%; outputs identical: {same})")
    print(f"specprobe τ per position (vLLM, full-length drafts): {r1.counters.tau_tokens:.3f}; accept rate {r1.counters.accept_rate:.3f}")
    print(f"timing spread: assisted {statistics.pstdev(hf):.2f}, b1 {statistics.pstdev(s1):.2f}, b8 {statistics.pstdev(s8):.2f} tokens/s")
    if a.skip_calibration:
        return
    print(f"\n== estimate vs measured τ (temperature 0.7, K=4, {a.calib_prompts} built-in prompts × {a.calib_tokens} tokens) ==")
    for layers in (28, 24):
        c = calibration(layers, a.calib_prompts, a.calib_tokens, 4)
        print(f"self:layers={layers}: α={c['alpha']:.3f}  τ estimated {c['tau_est']:.3f}  τ measured {c['tau_meas']:.3f}  gap {100 * c['gap_rel']:+.1f}%  ({c['drafts']} drafts, measured accept rate {c['accept_meas']:.3f})")
        print("   per-position r_i estimate " + " ".join(f"{x:.3f}" for x in c["cum_est"]) + "  measured " + " ".join(f"{x:.3f}" for x in c["cum_meas"]))


if __name__ == "__main__":
    main()
