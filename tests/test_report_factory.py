"""A generator of realistic result JSON dicts (what `diagnose --json` / `simulate --json`
write), so report and compare tests never depend on hand-typed giant literals.

The per-position rows are drawn from a small generative model (target entropy, domain
offsets, context decay) and every aggregate — by-domain, by-entropy, by-position tables,
histograms, depth curves, τ(K), speedups, metrics, findings — is *computed* from them with
the maths of docs/maths.md, so the numbers in a fixture agree with each other the way a
real run's do. Findings come from the real rules table.

Other test modules import `make_result` from here; the tests at the bottom check that the
saved example in tests/data/results/ is what the generator writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).parent / "data" / "results"
EXAMPLE = DATA / "diagnose_example.json"
SIM_EXAMPLE = DATA / "simulate_example.json"

DOMAINS = ("code", "math", "chat", "summarization", "translation", "qa")
# How each domain sits against the overall quality: a self-draft finds code and math
# easier (low-entropy continuations) and translation harder.
DOMAIN_OFFSET = {"code": 0.08, "math": 0.05, "chat": 0.0, "summarization": -0.02, "translation": -0.10, "qa": 0.01}
ENTROPY_EDGES = (0.0, 0.5, 1.0, 2.0, 3.0, math.inf)
POSITION_EDGES = (0, 16, 32, 48, 64)
K_MAX = 8


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


def _stats(rows: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, Any]:
    n = int(mask.sum())

    def mean(name: str) -> float | None:
        return round(float(rows[name][mask].mean()), 6) if n else None

    return {
        "positions": n,
        "accept_prob_mean": mean("accept_prob"),
        "greedy_agree_frac": mean("greedy_agree"),
        "kl_target_draft_nats": mean("kl_target_draft_nats"),
        "tv_mean": round(1 - float(rows["accept_prob"][mask].mean()), 6) if n else None,
        "target_entropy_nats": mean("target_entropy_nats"),
        "draft_confidence_mean": mean("draft_confidence"),
    }


def _bucket_label(lo: float, hi: float, unit: str) -> str:
    if unit == "nats":
        return f"≥ {lo:.1f} nats" if math.isinf(hi) else f"{lo:.1f}–{hi:.1f} nats"
    return f"{int(lo)}–{int(hi) - 1}"


def make_result(
    *,
    alpha: float = 0.52,
    command: str = "diagnose",
    seed: int = 0,
    num_prompts: int = 24,
    tokens_per_prompt: int = 64,
    domain_offset: dict[str, float] | None = None,
    depth_decay: float = 0.97,
    kl_scale: float = 1.3,
    cost_ratio: float = 0.93,
    verify_factor: float = 1.0,
    target: str = "smollm2",
    drafter: str = "self:layers=28",
    drafter_kind: str = "layer_skip",
    prompt_sha256: str = "3f1c9a0d5e7b2a4c6e8f0a1b3c5d7e9f1a2b3c4d5e6f708192a3b4c5d6e7f809",
    temperature: float = 0.7,
    with_positions: bool = True,
    fail_on: str = "error",
) -> dict[str, Any]:
    """A complete, self-consistent result dict (schema_version 1)."""
    from specprobe.rules import load_table, verdict, worst_severity

    rng = np.random.default_rng(seed)
    offsets = dict(DOMAIN_OFFSET if domain_offset is None else {**DOMAIN_OFFSET, **domain_offset})
    n = num_prompts * tokens_per_prompt

    # ---- per-position rows from a small generative model
    prompt_id = np.repeat(np.arange(num_prompts), tokens_per_prompt)
    domain = np.array([DOMAINS[p % len(DOMAINS)] for p in prompt_id])
    position = np.tile(np.arange(tokens_per_prompt), num_prompts)
    entropy = rng.gamma(shape=1.6, scale=0.9, size=n)
    off = np.array([offsets[d] for d in domain])
    logit_a = (
        math.log(alpha / (1 - alpha))
        + 3.0 * off
        - 0.55 * (entropy - entropy.mean())
        - 0.004 * position  # acceptance sags a little with context
        + rng.normal(0, 0.9, n)
    )
    accept = np.clip(1 / (1 + np.exp(-logit_a)), 0.001, 1.0)
    kl = np.clip(kl_scale * -np.log(accept) + rng.normal(0, 0.05, n), 0.0, None)
    greedy = (rng.random(n) < np.clip(accept + 0.15, 0, 1)).astype(int)
    conf = np.clip(0.25 + 0.6 * accept + rng.normal(0, 0.08, n), 0.01, 1.0)
    rows = {
        "accept_prob": accept,
        "greedy_agree": greedy,
        "kl_target_draft_nats": kl,
        "target_entropy_nats": entropy,
        "draft_confidence": conf,
    }
    every = np.ones(n, dtype=bool)
    overall = _stats(rows, every)

    by_domain = [{"group": d, **_stats(rows, domain == d)} for d in DOMAINS]
    by_entropy = []
    for lo, hi in zip(ENTROPY_EDGES[:-1], ENTROPY_EDGES[1:], strict=True):
        m = (entropy >= lo) & (entropy < hi)
        by_entropy.append({"group": _bucket_label(lo, hi, "nats"), "lo": lo, "hi": None if math.isinf(hi) else hi, **_stats(rows, m)})
    by_position = []
    for lo, hi in zip(POSITION_EDGES[:-1], POSITION_EDGES[1:], strict=True):
        m = (position >= lo) & (position < hi)
        by_position.append({"group": _bucket_label(lo, hi, "pos"), "lo": lo, "hi": hi, **_stats(rows, m)})

    def hist(values: np.ndarray, hi: float) -> dict[str, list]:
        edges = np.linspace(0.0, hi, 21)
        counts, _ = np.histogram(np.clip(values, 0, hi), bins=edges)
        return {"edges": [round(float(e), 4) for e in edges], "counts": [int(c) for c in counts]}

    # ---- depth curves along the trajectory: r_j(t) = Π_{i<j} α^{(i+1)}_{t+i};
    # deeper predictions of a layer-skip drafter are its ordinary next-token ones, but
    # conditioned on its own earlier guesses — model that as a per-depth decay.
    cum = []
    for j in range(1, K_MAX + 1):
        prods = []
        for p in range(num_prompts):
            a = accept[p * tokens_per_prompt : (p + 1) * tokens_per_prompt]
            for t in range(tokens_per_prompt - j + 1):
                prods.append(float(np.prod(a[t : t + j] * depth_decay ** np.arange(j))))
        cum.append(float(np.mean(prods)))
    cond = [cum[0]] + [cum[j] / cum[j - 1] for j in range(1, K_MAX)]
    a_mean = overall["accept_prob_mean"]
    k_table = []
    for k in range(1, K_MAX + 1):
        tau = 1 + sum(cum[:k])
        iid = (1 - a_mean ** (k + 1)) / (1 - a_mean)
        speed = tau / (1 + k * cost_ratio) / verify_factor
        k_table.append({"k": k, "tau_tokens": round(tau, 6), "accept_rate": round((tau - 1) / k, 6), "iid_tau_tokens": round(iid, 6), "speedup": round(speed, 6)})
    best = max(k_table, key=lambda r: r["speedup"])
    adaptive_speed = best["speedup"] * 1.06

    hi_ent = entropy >= 2.0
    dom_means = [r["accept_prob_mean"] for r in by_domain]
    metrics: dict[str, Any] = {
        "accept_prob_mean": a_mean,
        "greedy_agree_frac": overall["greedy_agree_frac"],
        "kl_target_draft_nats": overall["kl_target_draft_nats"],
        "kl_target_draft_p90_nats": round(float(np.quantile(kl, 0.9)), 6),
        "tv_mean": overall["tv_mean"],
        "target_entropy_nats": overall["target_entropy_nats"],
        "draft_confidence_mean": overall["draft_confidence_mean"],
        "accept_prob_domain_min": min(dom_means),
        "accept_prob_domain_spread": round(max(dom_means) - min(dom_means), 6),
        "accept_prob_high_entropy": round(float(accept[hi_ent].mean()), 6),
        "accept_prob_long_context_ratio": round(by_position[-1]["accept_prob_mean"] / by_position[0]["accept_prob_mean"], 6),
        "cond_accept_depth_decay": round(cond[-1] / cond[0], 6),
        "tau_tokens": best["tau_tokens"],
        "accept_rate_best_k": best["accept_rate"],
        "best_k": best["k"],
        "speedup_best": best["speedup"],
        "speedup_adaptive": round(adaptive_speed, 6),
        "cost_ratio": cost_ratio,
        "num_positions": n,
        "num_prompts": num_prompts,
        "reference_off_policy": 0,
        # check metrics: a clean pairing
        "vocab_size_target": 49152,
        "vocab_size_draft": 49152,
        "vocab_size_diff": 0,
        "tokenizer_size_diff": 0,
        "token_id_mismatch_count": 0,
        "token_id_mismatch_frac": 0.0,
        "bos_id_mismatch": 0,
        "eos_id_mismatch": 0,
        "chat_template_mismatch": 0,
        "temperature_target": temperature,
        "temperature_draft": temperature,
        "temperature_abs_diff": 0.0,
        "draft_greedy_target_sampling": 0,
    }

    table = load_table()
    evaluations = table.evaluate(metrics, kind=drafter_kind, families=["0", "1", "2", "3"])
    findings = [e.finding for e in evaluations if e.finding is not None]
    from specprobe.rules import sort_findings

    findings = sort_findings(findings)

    result: dict[str, Any] = {
        "schema_version": 1,
        "command": command,
        "specprobe_version": "0.1.0",
        "created": f"2025-06-0{1 + seed % 9}T12:00:00+00:00",
        "config": {
            "target": target,
            "drafter": drafter,
            "temperature": temperature,
            "draft_temperature": temperature,
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "draft_top_k": 0,
            "draft_top_p": 1.0,
            "max_new_tokens": tokens_per_prompt,
            "reference": "on-policy",
            "seed": seed,
            "k_max": K_MAX,
            "verify_factor": verify_factor,
            "prompts": "builtin",
            "domains": None,
            "max_prompts": num_prompts,
            "device": "cpu",
            "dtype": "float32",
            "rules": [],
            "fail_on": fail_on,
        },
        "environment": {
            "device": "cpu",
            "dtype": "float32",
            "torch": "2.13.0+cpu",
            "transformers": "4.57.0",
            "python": "3.11.7",
            "platform": "Linux-x86_64",
            "packages": {"numpy": "2.2.0", "gguf": "0.17.1"},
        },
        "target": {"spec": target, "name": "SmolLM2-135M-Instruct", "num_layers": 30, "vocab_size": 49152, "params": 134515008},
        "drafter": {"spec": drafter, "kind": drafter_kind, "name": f"SmolLM2-135M-Instruct[{drafter}]", "num_layers": 28, "params": None},
        "prompt_set": {"name": "builtin", "source": "specprobe/prompts/builtin.jsonl", "sha256": prompt_sha256, "num_prompts": num_prompts, "domains": list(DOMAINS)},
        "reference": "on-policy",
        "verdict": verdict(findings),
        "worst_severity": worst_severity(findings),
        "findings": [f.to_dict() for f in findings],
        "evaluations": [{"rule_id": e.rule.id, "name": e.rule.name, "severity": e.rule.severity, "status": e.status} for e in evaluations],
        "metrics": {k: _nan_to_none(v) for k, v in metrics.items()},
        "by_domain": by_domain,
        "by_entropy": by_entropy,
        "by_position": by_position,
        "histograms": {"accept_prob": hist(accept, 1.0), "kl_target_draft_nats": hist(kl, 8.0)},
        "depth": {"depth": list(range(1, K_MAX + 1)), "cumulative": [round(c, 6) for c in cum], "conditional": [round(c, 6) for c in cond], "source": "estimate"},
        "k_table": k_table,
        "best_k": best["k"],
        "adaptive": {"threshold": 0.45, "tau_tokens": round(best["tau_tokens"] * 0.97, 6), "speedup": round(adaptive_speed, 6), "mean_k": round(best["k"] * 0.8, 3)},
        "cost": {"cost_ratio": cost_ratio, "verify_factor": verify_factor, "target_step_ms": 41.5, "draft_step_ms": round(41.5 * cost_ratio, 3), "measured": True},
    }
    if with_positions:
        result["positions"] = {
            "prompt_id": [int(x) for x in prompt_id],
            "domain": [str(x) for x in domain],
            "position": [int(x) for x in position],
            "accept_prob": [round(float(x), 5) for x in accept],
            "greedy_agree": [int(x) for x in greedy],
            "kl_target_draft_nats": [round(float(x), 5) for x in kl],
            "target_entropy_nats": [round(float(x), 5) for x in entropy],
            "draft_confidence": [round(float(x), 5) for x in conf],
        }
    if command == "simulate":
        # Measured by a real draft→verify loop: close to the estimate in aggregate, a
        # little noisy per K (a prototype measured 1.73 estimated vs 1.74).
        mrng = np.random.default_rng(seed + 100)
        baseline_tps = 14.4
        mk = []
        for row in k_table:
            tau_m = row["tau_tokens"] * (1 + float(mrng.normal(0, 0.02)))
            speed_m = tau_m / (1 + row["k"] * cost_ratio) / verify_factor
            mk.append({
                "k": row["k"],
                "tau_tokens": round(tau_m, 6),
                "accept_rate": round((tau_m - 1) / row["k"], 6),
                "speedup": round(speed_m, 6),
                "tokens_per_s": round(baseline_tps * speed_m, 3),
                "num_drafts": int(num_prompts * tokens_per_prompt / tau_m),
                "tau_estimate": row["tau_tokens"],
                "tau_gap": round(tau_m - row["tau_tokens"], 6),
            })
        mcum = [c * (1 + float(mrng.normal(0, 0.03))) for c in cum[:4]]
        mcond = [mcum[0]] + [mcum[j] / mcum[j - 1] for j in range(1, 4)]
        result["measured"] = {
            "k_table": mk,
            "depth": {"k": 4, "depth": [1, 2, 3, 4], "cumulative": [round(c, 6) for c in mcum], "conditional": [round(c, 6) for c in mcond]},
            "baseline_tokens_per_s": baseline_tps,
        }
    return result


def write_examples() -> None:
    """Regenerate the saved examples (run: python tests/test_report_factory.py)."""
    DATA.mkdir(parents=True, exist_ok=True)
    EXAMPLE.write_text(json.dumps(make_result(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    SIM_EXAMPLE.write_text(json.dumps(make_result(command="simulate", seed=1, num_prompts=12, with_positions=False), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- tests
def test_saved_examples_are_what_the_generator_writes() -> None:
    saved = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    fresh = json.loads(json.dumps(make_result(), ensure_ascii=False))
    # Rules other sessions append to the default table may change the evaluations list;
    # the measured content must not drift.
    for key in ("metrics", "by_domain", "by_entropy", "by_position", "depth", "k_table", "histograms", "positions"):
        assert saved[key] == fresh[key], key
    sim = json.loads(SIM_EXAMPLE.read_text(encoding="utf-8"))
    assert sim["command"] == "simulate" and "measured" in sim


def test_generated_numbers_agree_with_each_other() -> None:
    r = make_result()
    m = r["metrics"]
    assert 0.4 < m["accept_prob_mean"] < 0.65  # the 28-layer self-draft measures α ≈ 0.5
    assert sum(d["positions"] for d in r["by_domain"]) == m["num_positions"]
    assert sum(r["histograms"]["accept_prob"]["counts"]) == m["num_positions"]
    assert r["depth"]["cumulative"] == sorted(r["depth"]["cumulative"], reverse=True)
    row = next(x for x in r["k_table"] if x["k"] == r["best_k"])
    assert row["speedup"] == max(x["speedup"] for x in r["k_table"])
    assert any(f["rule_id"] == "SP204" for f in r["findings"])  # fair acceptance


if __name__ == "__main__":
    write_examples()
