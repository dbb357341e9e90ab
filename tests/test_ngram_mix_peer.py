"""n-gram types beside a draft model against the real llama-server 0.3.36
(benchmarks/build_llama_server.sh): `-md <SmolLM2 cut to 28 layers> --spec-type
draft-simple,ngram-simple` (size_n 4, size_m 8), K = 3, greedy, one slot, on the
built-in code and summarization prompts. On the text the server emitted, specprobe's
walk (probe.ngram.walk_mixed, one n-gram slot kept across the requests, the same draft
GGUF dequantised and teacher-forced along each response) drafts and accepts what the
server's counters say, request by request, and splits the drafts between the n-gram type
and the draft model as the server's own per-type statistics (its log) do. The n-gram
side is the algorithm alone; the model side also rests on the draft model's argmaxes,
which llama.cpp computes on the Q4_1 weights and specprobe on their fp32 dequantisation:
where two tokens nearly tie these part ways (one request of the six here), so one
request may differ. Skipped when the server binary or the SmolLM2 GGUF is absent."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import requires_smollm2
from tests.helpers.llamacpp import BUILD_SCRIPT, find_llama_server

BINARY = find_llama_server()
pytestmark = [
    requires_smollm2,
    pytest.mark.skipif(BINARY is None, reason=f"no llama-server binary (build it with {BUILD_SCRIPT})"),
    pytest.mark.usefixtures("one_torch_thread"),
]
K, LAYERS, MAX_NEW = 3, 28, 64
NGRAM = "ngram-simple:size_n=4,size_m=8"
FLAGS = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "8")
_STATS = re.compile(r"statistics\s+(\S+): .*#gen drafts =\s*(\d+), #acc drafts =\s*(\d+), #gen tokens =\s*(\d+), #acc tokens =\s*(\d+)")


def _per_request(log: str) -> list[dict[str, tuple[int, int, int]]]:
    """The server's cumulative per-type statistics, printed after each request -> each
    request's own (drafts, drafted tokens, accepted tokens) by type."""
    seen: list[dict[str, tuple[int, int, int]]] = []
    cur: dict[str, tuple[int, int, int]] = {}
    for m in _STATS.finditer(log):
        name, drafts, _, gen, acc = m.group(1), *map(int, m.groups()[1:])
        if name in cur:
            seen.append(cur)
            cur = {}
        cur[name] = (drafts, gen, acc)
    if cur:
        seen.append(cur)
    out, prev = [], {}
    for snap in seen:
        out.append({k: tuple(a - b for a, b in zip(v, prev.get(k, (0, 0, 0)), strict=True)) for k, v in snap.items()})
        prev = snap
    return out


def test_drafts_and_acceptances_match_the_servers_by_type(tmp_path: Path) -> None:
    from benchmarks.bench_ngram_peer import end_of_generation, prompts
    from specprobe.drafters.ngram import NgramDrafter
    from specprobe.models.loader import builtin_gguf_path, load_model
    from specprobe.probe.ngram import model_trace, walk_mixed
    from tests.helpers.llamacpp import llama_server, write_self_draft_gguf

    assert BINARY is not None
    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, tmp_path / f"smollm2-first{LAYERS}.gguf", LAYERS)
    encoded = prompts(6)[1]
    log = tmp_path / "server.log"
    with llama_server(BINARY, target, draft, K, log, extra=FLAGS) as srv:  # a worker's share of the cores
        responses = [srv.complete(p, MAX_NEW) for p in encoded]
    server = [(int(r["timings"].get("draft_n", 0)), int(r["timings"].get("draft_n_accepted", 0))) for r in responses]
    by_type = _per_request(log.read_text(errors="replace"))
    assert len(by_type) == len(encoded) and all(set(b) == {"ngram-simple", "draft-simple"} for b in by_type)

    model = load_model(str(draft), "cpu", "float32").model
    vocab = int(model.get_output_embeddings().weight.shape[0])
    slot = NgramDrafter(NGRAM).slot()  # one slot across the requests, as -np 1 keeps it
    eog = end_of_generation()
    equal = 0
    for p, r, (drafted, accepted), types in zip(encoded, responses, server, by_type, strict=True):
        toks = list(r.get("tokens") or [])
        s = walk_mixed(slot, model_trace(model, p, toks, vocab), p, toks, MAX_NEW, K, eog=eog)
        if (s.drafted, s.accepted) == (drafted, accepted):
            equal += 1
            # the same split: the n-gram type drafted where it matched, the model elsewhere
            assert s.drafts - s.model_drafts == types["ngram-simple"][0]
            assert s.model_drafts == types["draft-simple"][0]
            assert s.drafted == types["ngram-simple"][1] + types["draft-simple"][1]
    assert equal >= len(encoded) - 1
    assert sum(t["ngram-simple"][0] for t in by_type) > 0 and sum(t["draft-simple"][0] for t in by_type) > 0  # both drafted
