"""specprobe against a real vLLM in other server settings, each its own start (the module
server of tests/test_vllm.py is the plain K = 4 draft model): probabilistic drafting at
K = 2, the `ngram` method, and an EAGLE-3 head trained here for 60 steps. The same pair and
prompts as tests/test_vllm.py; skipped when vLLM is not installed, a failure where CI
expects it (SPECPROBE_EXPECT_VLLM=1).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.vllm import serve_prompts, smollm2_pair_ids, vllm_server
from tests.test_vllm import (
    LAYERS,
    MAX_TOKENS,
    PROMPTS,
    ROOT,
    K,
    _against,
    _assert_agrees,
    _specprobe,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return smollm2_pair_ids(tmp_path_factory.mktemp("vllm-methods"), LAYERS, PROMPTS)


# ----------------------------------------------------------------------------- other server settings
def test_against_probabilistic_drafting_at_k2(vllm_python: Path, pair: dict[str, Any]) -> None:
    """A server with draft_sample_method probabilistic and K = 2 (its own start): drafts
    sampled from the drafter's tempered distribution, accepted with min(1, p/q).
    `diagnose --draft-sampling probabilistic --against` at T = 0.7 agrees within the
    statistical bound."""
    with vllm_server(vllm_python, pair["target"], pair["draft"], 2, pair["work"] / "vllm-prob2.log", startup_timeout=900,
                     draft_sampling="probabilistic") as s:  # fmt: skip
        r = _against(pair, s.base, pair["work"] / "against-prob2.json", "--draft-sampling", "probabilistic")
    live = r["live"]
    assert live["k"] == 2 and live["requests"] == PROMPTS and live["draft_tokens"] == 2 * live["drafts"]
    assert (live["counted_by"], live["in_flight"]) == ("totals", 1)  # no per-request counters: one at a time
    assert r["procedure"]["drafting"] == "probabilistic"
    _assert_agrees(live)


def test_ngram_prompt_lookup_as_vllm_serves_it(vllm_python: Path, pair: dict[str, Any]) -> None:
    """vLLM's `ngram` method (prompt_lookup_min 2, max 5, K = 4; its own start, no draft
    model) against `diagnose` and `simulate ngram:min=2,max=5` at T = 0 (`diagnose --against`
    takes model drafters only). Both sides are deterministic, so the bound is 5 % of
    accepted ÷ drafted (the benchmark read +0.5 % on 16 prompts; on these 8 the loop reads
    0.543 against vLLM's 0.538). The draft counts themselves differ: vLLM drafts K to the
    end of a request, specprobe at most the budget left − 1, and n-gram matches come late
    in an answer (70 draft tokens against vLLM's 91 here), so only the rate is compared."""
    with vllm_server(vllm_python, pair["target"], None, K, pair["work"] / "vllm-ngram.log", startup_timeout=900, method="ngram",
                     extra_spec={"prompt_lookup_min": 2, "prompt_lookup_max": 5}) as s:  # fmt: skip
        counts, _ = serve_prompts(s, pair["ids"], MAX_TOKENS, temperature=0.0, deadline_s=600)
    assert counts.drafts > 0 and counts.draft_tokens <= K * counts.drafts  # up to K a draft (fewer where the match's continuation is short)
    drafter = "ngram:min=2,max=5"
    sim = _specprobe("simulate", pair, pair["work"] / "simulate-ngram.json", "--k", str(K), "--batch-size", str(PROMPTS), drafter=drafter)
    row = next(r for r in sim["k_table"] if r["k"] == K)  # diagnose's estimate, in simulate's result
    assert (row["accept_rate_renewal"] or row["accept_rate"]) == pytest.approx(counts.accept_rate, rel=0.05), (row, counts)
    measured = next(r for r in sim["measured"]["k_table"] if r["k"] == K)
    assert measured["accept_rate"] == pytest.approx(counts.accept_rate, rel=0.05), (measured, counts)


@pytest.fixture(scope="module")
def eagle3_head(pair: dict[str, Any]) -> Path:
    """An EAGLE-3 head for SmolLM2 in the speculators layout, trained here by
    benchmarks/train_heads.py on its own prompts (not the test's) for 60 optimizer steps
    (a fixed count, so the same head however loaded the machine; about 30 s idle, a minute
    in all): it drafts well enough to be measured (diagnose: 12 % at position 1)."""
    out = pair["work"] / "heads"
    cmd = [sys.executable, "benchmarks/train_heads.py", "--out", str(out), "--which", "eagle3", "--save-at-steps", "60",
           "--prompts", "24", "--tokens", "32", "--draft-vocab", "4096"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "eagle3-60steps"


def test_an_eagle3_head_as_vllm_serves_it(vllm_python: Path, pair: dict[str, Any], eagle3_head: Path) -> None:
    """vLLM's `eagle3` method with the head specprobe's writer saved (its own start, K = 2,
    greedy, T = 0) against `diagnose` of the same head. The CPU build loads it (sharing the
    target's embeddings, keeping the head's own LM head and draft vocabulary). Both sides
    are deterministic, so the bound is in accepted tokens: 5 % of accepted ÷ drafted or
    three accepted tokens, whichever is more, and per position 0.03 and one token. A head
    trained for 30 s of wall time read 24 of 444 drafted on vLLM and 26.3 in diagnose (2.3
    tokens, +9.5 %); the 6-minute head of the benchmark −1.3 % and +2.0 % at K = 4 and 2.
    The likely cause, not measured: a head this briefly trained is unsure of many tokens, and where its top two nearly tie,
    vLLM's fp32 kernels and torch's can pick differently. The per-position rates compared are the K row's, counted as the
    server counts them (rounds start where the previous one ended): the depth curve, which
    counts every start, read position 1 at 0.227 where vLLM read 0.190 for a head whose
    rejections come in runs (benchmarks/bench_vllm_peer.py, docs/engines/vllm.md)."""
    k = 2
    with vllm_server(vllm_python, pair["target"], None, k, pair["work"] / "vllm-eagle3.log", startup_timeout=900, method="eagle3",
                     extra_spec={"model": str(eagle3_head)}) as s:  # fmt: skip
        counts, _ = serve_prompts(s, pair["ids"], MAX_TOKENS, temperature=0.0, deadline_s=600)
    assert counts.accepted > 10 and counts.draft_tokens == k * counts.drafts, counts  # it drafts, and accepts some
    diag = _specprobe("diagnose", pair, pair["work"] / "diagnose-eagle3.json", drafter=str(eagle3_head))
    assert diag["drafter"]["kind"] == "eagle3", diag["drafter"]
    row = next(r for r in diag["k_table"] if r["k"] == k)
    tokens = abs(row["accept_rate_renewal"] - counts.accept_rate) * counts.draft_tokens  # the gap in accepted tokens
    assert tokens <= max(0.05 * counts.accepted, 3.0), (tokens, row, counts)
    step = 1.0 / counts.drafts
    assert row["per_position_renewal"] == pytest.approx(counts.per_pos_rate, abs=0.03 + step), (row["per_position_renewal"], counts)
