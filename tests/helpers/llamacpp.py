"""llama.cpp's `llama-server` as a real serving engine for the tests and the peer
benchmark: where the built binary lies, a layer-cut self-draft GGUF for it, and a server
process on loopback with helpers for its HTTP API.

The binary is built by benchmarks/build_llama_server.sh into
`$SPECPROBE_LLAMA_SERVER_DIR` (default ~/.cache/specprobe/llama.cpp)/<version>/bin/;
`SPECPROBE_LLAMA_SERVER` may name a binary directly.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import engine_cache, stop, wait_healthy
from tests.helpers.gguf_tiny import rewrite_gguf

BUILD_SCRIPT = "benchmarks/build_llama_server.sh"


def server_root() -> Path:
    return engine_cache("SPECPROBE_LLAMA_SERVER_DIR", "llama.cpp")


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in name.split("."))


def find_built(tool: str, env: str) -> Path | None:
    """A llama.cpp tool built by benchmarks/ into the cache (its newest version there;
    the executable `$env` names instead, when set), or None."""
    explicit = os.environ.get(env)
    if explicit:
        p = Path(explicit).expanduser()
        return p if p.is_file() and os.access(p, os.X_OK) else None
    root = server_root()
    if not root.is_dir():
        return None
    found = [d for d in root.iterdir() if not d.name.startswith(".") and (d / "bin" / tool).is_file()]
    if not found:
        return None
    return max(found, key=lambda d: _version_key(d.name)) / "bin" / tool


def find_llama_server() -> Path | None:
    """The built llama-server (newest version in the cache), or None."""
    return find_built("llama-server", "SPECPROBE_LLAMA_SERVER")


# ----------------------------------------------------------------------------- GGUF
def write_self_draft_gguf(src: Path, dst: Path, n_layers: int) -> Path:
    """A copy of a llama-architecture GGUF cut to its first `n_layers` blocks: the same
    embedding, final norm and head, `llama.block_count` = n_layers. Tensor data is copied
    byte for byte (quantised as in the source), so the drafter computes exactly the
    target's first n_layers blocks — a layer-skip self-draft that llama.cpp loads as an
    ordinary `--model-draft`."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    total = int(reader.fields[count_key].contents())
    if not 1 <= n_layers < total:
        raise ValueError(f"n_layers must be in 1..{total - 1}, got {n_layers}")

    def keep(name: str) -> bool:
        return not name.startswith("blk.") or int(name.split(".")[1]) < n_layers

    tensors = [(t.name, t.data, t.tensor_type) for t in reader.tensors if keep(t.name)]
    return rewrite_gguf(reader, dst, tensors, {count_key: n_layers})


# ----------------------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 600.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read().decode())


def http_text(url: str, timeout: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback only
        return str(resp.read().decode())


@dataclass
class LlamaServer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def complete(self, prompt: Sequence[int] | str, n_predict: int, *, temperature: float = 0.0, seed: int = 0) -> dict[str, Any]:
        """One /completion, greedy by default; the response carries `timings` with the
        server's own draft_n / draft_n_accepted for this request. At temperature > 0 the
        sampler chain is temperature alone (top-k 0, top-p 1, min-p 0: each off, as the
        server reads them), so the target samples from its plain tempered distribution."""
        body = {
            "prompt": list(prompt) if not isinstance(prompt, str) else prompt,
            "n_predict": n_predict,
            "temperature": temperature,
            "top_k": 1 if temperature == 0 else 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "seed": seed,
            "cache_prompt": False,  # every request drafts from a cold start, as simulate does
            "return_tokens": True,
        }
        out: dict[str, Any] = http_json(self.base + "/completion", body)
        return out


def worker_threads() -> int:
    """Two threads, or a pytest-xdist worker's share of the cores: two servers of two
    threads each on a 2-core machine wait on each other at every step."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, (os.cpu_count() or 1) // workers))


def server_command(binary: Path, target: Path, draft: Path | None, port: int, k: int, *, threads: int = 2, ctx: int = 2048, extra: tuple[str, ...] = ()) -> list[str]:
    """Greedy speculative decoding with a fixed draft length K: no minimum draft length
    and no confidence cut-off (p_min 0), one slot so requests never share a batch.
    Verbosity 4 (trace) adds the per-position acceptance line to the log. `extra`: more
    flags (the KV-cache types: -ctk q8_0 -ctv q8_0 …). `draft` None: the target alone."""
    spec = [
        "--spec-type", "draft-simple",  # this build infers no type from a plain draft GGUF
        "--spec-draft-model", str(draft),
        "--spec-draft-n-max", str(k),
        "--spec-draft-n-min", "0",
        "--spec-draft-p-min", "0",
        "--spec-draft-threads", str(threads),
        "--spec-draft-poll", "0",
    ] if draft is not None else []  # fmt: skip
    return [
        str(binary),
        "-m", str(target),
        *spec,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--metrics",
        "-np", "1",
        "-c", str(ctx),
        "-t", str(threads),
        "-tb", str(threads),
        "--poll", "0",
        "--no-warmup",
        "-lv", "4",
        "--log-colors", "off",
        *extra,
    ]


@contextmanager
def llama_server(binary: Path, target: Path, draft: Path | None, k: int, log: Path, *, threads: int | None = None, startup_timeout: float = 300.0, extra: tuple[str, ...] = ()) -> Iterator[LlamaServer]:
    """Start llama-server on a free loopback port, wait for /health, stop it on exit.
    `threads`: this test worker's share of the cores unless given."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as fh:
        # Passive OpenMP waits: on a shared, oversubscribed CPU the default spin-waiting of
        # two thread pools (target and draft) makes every step many times slower.
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        proc = subprocess.Popen(server_command(binary, target, draft, port, k, threads=threads or worker_threads(), extra=extra), stdout=fh, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # noqa: S603
    server = LlamaServer(proc, port, log)
    try:
        wait_healthy(proc, log, "llama-server", lambda: http_json(server.base + "/health", timeout=5).get("status") == "ok", startup_timeout, 0.5)
        yield server
    finally:
        stop(proc, 30)
