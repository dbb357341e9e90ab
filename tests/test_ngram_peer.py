"""The n-gram drafters against the real llama-server (benchmarks/build_llama_server.sh)
with `--spec-type ngram-simple` and `ngram-map-k`: on the text the server emitted, greedy,
specprobe's drafter proposes and accepts exactly what the server's own counters say,
request by request (one slot kept across the requests, as the server's -np 1 slot keeps
its state). Skipped when the server binary or the SmolLM2 GGUF is absent."""

from __future__ import annotations

import pytest

from benchmarks.bench_ngram_peer import TYPES, prompts, replay, serve
from tests.conftest import requires_smollm2
from tests.helpers.llamacpp import BUILD_SCRIPT, find_llama_server, worker_threads

BINARY = find_llama_server()
pytestmark = [
    requires_smollm2,
    pytest.mark.skipif(BINARY is None, reason=f"no llama-server binary (build it with {BUILD_SCRIPT})"),
]
MAX_NEW = 64


@pytest.fixture(scope="module")
def encoded() -> list[list[int]]:
    return prompts(6)[1]


@pytest.mark.parametrize("label", ["ngram-simple n=4 m=8", "ngram-map-k n=4 m=8"])
def test_proposals_and_acceptances_match_the_servers_counters(label: str, encoded, tmp_path) -> None:
    flags, spec = TYPES[label]
    assert BINARY is not None
    responses = serve(BINARY, flags, encoded, MAX_NEW, tmp_path / "server.log", threads=worker_threads())  # the replay reads the server's own tokens: any thread count
    server = [(int(r["timings"].get("draft_n", 0)), int(r["timings"].get("draft_n_accepted", 0))) for r in responses]
    assert replay(spec, encoded, responses, MAX_NEW) == server
    assert sum(d for d, _ in server) > 0  # the server did draft on these prompts
