"""Helpers the tests share: tiny checkpoints, head layouts, the llama.cpp server, and
stopping the servers a test starts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def engine_cache(env: str, name: str) -> Path:
    """Where a peer engine built or installed by benchmarks/ lies: `$env`, else
    ~/.cache/specprobe/<name> (or under $XDG_CACHE_HOME)."""
    given = os.environ.get(env)
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "specprobe" / name


def stop(proc: subprocess.Popen, timeout: float) -> None:  # type: ignore[type-arg]
    """Ask a server to stop; kill it when it does not within `timeout` seconds. A server
    started in a session of its own (`start_new_session=True`) is stopped with everything
    it started: vLLM's API server leaves its engine core running (2.5 GB, a core's share)
    when it is killed, or killed while it waits for it."""
    group = _own_group(proc)
    try:
        os.killpg(proc.pid, signal.SIGTERM) if group else proc.terminate()
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        proc.wait()
    if group:
        kill_group(proc)


def _own_group(proc: subprocess.Popen) -> bool:  # type: ignore[type-arg]
    try:
        return os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:  # exited and reaped: whatever is left of a group of that id goes too (none, unless it led one)
        return True


def kill_group(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGKILL a server started in a session of its own and every process left in it (as
    a machine's crash would), then reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_healthy(proc: subprocess.Popen, log: Path, label: str, healthy: Callable[[], bool], startup_timeout: float, poll: float) -> None:  # type: ignore[type-arg]
    """Wait until `healthy()` says so, every `poll` seconds; RuntimeError with the log's
    tail when the server exits first, or when it is not healthy after `startup_timeout`."""
    deadline = time.monotonic() + startup_timeout
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{label} exited with {proc.returncode} during startup:\n{tail}")
        try:
            if healthy():
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label} not healthy after {startup_timeout:.0f}s; log: {log}")
        time.sleep(poll)


def runs_without(commands: list[list[str]], heavy: tuple[str, ...], *, block_torch: bool = False, setup: str = "") -> None:
    """Run specprobe commands in a fresh interpreter and assert none of `heavy` was
    imported (with `block_torch`, `import torch` fails outright). `setup` is Python run
    first; a command's items may name variables it sets."""
    code = "import sys\n" + ("sys.modules['torch'] = None  # import torch now raises ImportError\n" if block_torch else "")
    code += "from typer.testing import CliRunner\nfrom specprobe.cli.main import app\n" + setup
    for args in commands:
        code += f"r = CliRunner().invoke(app, [{', '.join(args)}])\nassert r.exit_code == 0, r.output\n"
    code += f"print('HEAVY:' + ','.join(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)  # a hang guard: a cold start on a stalled disk is slow, not hung
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY:\n" in proc.stdout, proc.stdout


def one_line_refusal(res: Any, *needles: str) -> None:
    """A CLI result refused with exit code 2 and one line, `error: …`, naming every needle."""
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for n in needles:
        assert n in lines[0], (n, lines[0])


def read_serving_text(tmp_path: Path, name: str, text: str) -> Any:
    """`text` written to tmp_path/name and read back as a serving config."""
    from specprobe.settings.serving import read_serving_config

    path = tmp_path / name
    path.write_text(text)
    return read_serving_config(path)


def loopback_stub(handler: type) -> Iterator[str]:
    """A `http.server` handler class served on 127.0.0.1 (a free port) in a thread: yields
    its base URL, and shuts it down however the test ends. For stand-ins of an engine's API
    where a test needs an answer the real engine cannot be made to give."""
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class CrashingProxy:
    """A TCP pass-through on loopback in front of a live server (`base`, http://host:port)
    that can fail as a crashed server does, without killing the server behind it: `crash()`
    stops listening (a new connection is refused) and ends every open connection mid-way
    (its request unanswered, as the kernel ends a killed process's). Bytes pass unchanged
    both ways until then. Lets a test crash "a server" mid-run and carry on against the same
    real server at another address, without starting a second one."""

    def __init__(self, base: str) -> None:
        import socket
        import threading
        from urllib.parse import urlsplit

        parts = urlsplit(base)
        self._to = (parts.hostname or "127.0.0.1", int(parts.port or 80))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._crashed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # the listener closed: crashed
                return
            try:
                upstream = socket.create_connection(self._to, timeout=30)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._crashed:
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: Any, dst: Any) -> None:
        import socket

        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)  # an orderly close passes on as one
        except OSError:
            pass

    def crash(self) -> None:
        import socket
        import struct

        with self._lock:
            self._crashed = True
            with contextlib.suppress(OSError):  # wakes the accept thread, so the port is really closed
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            for s in self._open:  # shutdown wakes the threads blocked in recv on it; close alone would not
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()
