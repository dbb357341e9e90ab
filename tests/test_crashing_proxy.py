"""The test harness's CrashingProxy (tests/helpers): bytes pass both ways until it crashes;
then a request in flight ends at once, unanswered, and a new connection is refused, as a
client of a killed server sees. The vLLM resume test relies on both: a request left
hanging would only end at the client's own timeout, minutes later."""

from __future__ import annotations

import http.server
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.client import RemoteDisconnected
from typing import Any

import pytest

from tests.helpers import CrashingProxy


@pytest.fixture
def upstream() -> Iterator[tuple[str, threading.Event]]:
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/hang":
                release.wait(30)
            body = self.path.encode() * 1000
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", release
    finally:
        release.set()
        srv.shutdown()
        srv.server_close()


def test_bytes_pass_then_a_crash_ends_requests_in_flight_and_refuses_new_ones(upstream: tuple[str, threading.Event]) -> None:
    base, _ = upstream
    proxy = CrashingProxy(base)
    assert urllib.request.urlopen(proxy.base + "/abc", timeout=10).read() == b"/abc" * 1000
    said: dict[str, Any] = {}

    def hang() -> None:
        try:
            urllib.request.urlopen(proxy.base + "/hang", timeout=30).read()
            said["error"] = None
        except (OSError, RemoteDisconnected) as e:
            said["error"] = e

    t = threading.Thread(target=hang)
    t.start()
    time.sleep(0.5)
    proxy.crash()
    t.join(timeout=60)
    # ended by the crash (the connection dropped), not by the client's timeout (TimeoutError)
    assert isinstance(said.get("error"), (RemoteDisconnected, ConnectionResetError)), said
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(proxy.base + "/abc", timeout=10)
    assert isinstance(refused.value.reason, ConnectionRefusedError), refused.value
    assert urllib.request.urlopen(base + "/abc", timeout=10).read() == b"/abc" * 1000  # the server behind it lives on
