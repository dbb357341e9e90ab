"""diagnose --target-server without a real server: the vLLM client's prompt_logprobs on
an answer vLLM 0.32.0's CPU build wrote (ids 1..8 sent, top-5 asked), its one-line
errors against a loopback stand-in (max_logprobs too small, a model it does not serve),
the settings (`--target-server URL DRAFTER`) and what the pipeline refuses before
loading anything. The real vLLM runs in tests/test_vllm_remote.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest

from specprobe.core.errors import ConfigError
from specprobe.engines import get
from specprobe.metrics.remote import TopN
from specprobe.probe.remote import check_tokenizers, refuse
from specprobe.settings.options import merge
from specprobe.settings.pipeline import DiagnoseConfig
from tests.helpers import loopback_stub

DATA = Path(__file__).parent / "data" / "vllm"
SENT = [1, 2, 3, 4, 5, 6, 7, 8]


class _Stub(BaseHTTPRequestHandler):
    max_logprobs: ClassVar[int] = 20
    tokenize: ClassVar[bool] = True

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "target", "root": "/models/smollm2"}]})
        elif self.path == "/version":
            self._send(200, {"version": "0.32.0"})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            if not type(self).tokenize:
                self._send(404, {"detail": "Not Found"})
            else:
                self._send(200, {"tokens": [7, 8, 9], "count": 3})
            return
        n = body.get("prompt_logprobs")
        if n is not None and n > type(self).max_logprobs:
            self._send(400, {"error": {"message": f"Requested prompt logprobs of {n}, which is greater than max allowed: {type(self).max_logprobs}", "type": "BadRequestError", "param": "prompt_logprobs", "code": 400}})
            return
        assert body["prompt"] == SENT and body["max_tokens"] == 1
        self._send(200, json.loads((DATA / "prompt_logprobs-0.32.0-cpu.json").read_text()))


@pytest.fixture()
def stub() -> Iterator[str]:
    _Stub.max_logprobs, _Stub.tokenize = 20, True
    yield from loopback_stub(_Stub)


def test_prompt_logprobs_as_vllm_writes_them(stub: str) -> None:
    s = get("vllm").live_server(stub, None)
    assert s.tokenizer_name == "/models/smollm2"  # vLLM's `root`: where its tokenizer came from
    got = s.prompt_logprobs(SENT, 5, timeout=30)
    assert len(got.rows) == len(SENT) - 1 and got.bytes > 1000  # every position after the first
    for row, sent in zip(got.rows, SENT[1:], strict=True):
        assert sent in row  # the actual token, listed whatever its rank
        assert sorted(r for _, r in row.values())[:5] == [1, 2, 3, 4, 5]  # and the top-5
    top = TopN.from_rows(got.rows, 5)
    first = got.rows[0]
    assert top.top1[0] == next(t for t, (_, r) in first.items() if r == 1)
    assert top.floor[0] == pytest.approx(next(v for v, r in first.values() if r == 5))


def test_the_clients_errors_name_the_server_setting(stub: str) -> None:
    s = get("vllm").live_server(stub, None)
    with pytest.raises(ConfigError, match="caps logprobs below the 50") as e:
        s.prompt_logprobs(SENT, 50, timeout=30)
    assert "--max-logprobs" in e.value.one_line()
    with pytest.raises(ConfigError, match="does not serve 'llama-405b'") as e:
        get("vllm").live_server(stub, "llama-405b")
    assert "--target-model" in e.value.one_line()
    assert s.tokenize("x", timeout=30) == [7, 8, 9]
    _Stub.tokenize = False
    assert s.tokenize("x", timeout=30) is None


class _Tok:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.ids


def test_tokenizers_must_round_trip(stub: str) -> None:
    s = get("vllm").live_server(stub, None)
    assert check_tokenizers(s, _Tok([7, 8, 9]), _Tok([7, 8, 9]), 30) == []
    with pytest.raises(ConfigError, match="server's token ids"):
        check_tokenizers(s, _Tok([7, 8]), _Tok([7, 8]), 30)
    with pytest.raises(ConfigError, match="drafter's tokenizer"):
        check_tokenizers(s, _Tok([7, 8, 9]), _Tok([1]), 30)
    _Stub.tokenize = False
    assert "no /tokenize" in check_tokenizers(s, _Tok([7, 8]), _Tok([7, 8]), 30)[0]


def test_one_model_given_is_the_drafter() -> None:
    opts = merge("diagnose", {"target": "./drafter", "drafter": None, "target_server": "http://h:8000"}, {"target", "target_server"})
    cfg = opts.diagnose_config()
    assert (cfg.target, cfg.drafter, cfg.target_server, cfg.target_logprobs) == ("", "./drafter", "http://h:8000", 20)
    assert cfg.to_dict()["target_server"] == "http://h:8000"
    assert "target_server" not in DiagnoseConfig(target="t", drafter="d").to_dict()  # recorded only when served
    with pytest.raises(ConfigError, match="needs a DRAFTER"):
        merge("diagnose", {"target": None, "drafter": None, "target_server": "http://h:8000"}, {"target_server"})


@pytest.mark.parametrize(("drafter", "extra", "said"), [
    ("self:layers=24", {}, "needs the target's weights"),
    ("self", {}, "needs the target's weights"),
    ("eagle3:/tmp/x", {}, "needs the target's weights"),
    ("./drafter", {"cost_ratio": None}, "cannot time the target"),
    ("./drafter", {"against": "http://x"}, "--against does not combine"),
])
def test_refused_before_anything_loads(drafter: str, extra: dict[str, Any], said: str) -> None:
    cfg = DiagnoseConfig(**{"target": "", "drafter": drafter, "target_server": "http://h:8000", "cost_ratio": 0.5, "verify_factor": 1.0, **extra})
    with pytest.raises(ConfigError, match=said):
        refuse(cfg)


def test_requests_in_flight_answer_in_order() -> None:
    import time

    from specprobe.engines.http import in_order

    lock, live, most = threading.Lock(), [0], [0]

    def ask(i: int) -> int:
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.02 * (5 - i % 5))  # later ones finish first
        with lock:
            live[0] -= 1
        return i * i

    assert list(in_order(ask, range(12), in_flight=3)) == [i * i for i in range(12)]
    assert 1 < most[0] <= 3
    assert list(in_order(ask, [])) == []

    def fail(i: int) -> int:
        if i == 2:
            raise ConfigError("no", "fix")
        return i

    with pytest.raises(ConfigError):
        list(in_order(fail, range(6)))


_HUNG = """
import os, signal, sys, threading
LEAVE = sys.argv[1] == "leave"
from specprobe.engines.http import in_order
never = threading.Event()

def ask(i):
    if i > 0:
        never.wait()  # a server that never answers: the request's own timeout is minutes away
    return i

threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    for got in in_order(ask, range(6), 4, leave_behind=LEAVE):
        print("answer", got, flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_leaves_requests_in_flight_behind() -> None:
    """Ctrl-C while requests are in flight (`diagnose --against`'s, which only wait on the
    server): the run goes on to keep what it has and the process exits, without waiting
    for answers that may be minutes away. Without `leave_behind` (the drafter may run in
    the threads) the exit waits for them, here for ever: the guard ends it."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _HUNG, "leave"], capture_output=True, text=True, timeout=120)  # a hang guard
    assert proc.returncode == 0 and proc.stdout.split() == ["answer", "0", "interrupted"], (proc.stdout, proc.stderr[-2000:])
    with pytest.raises(subprocess.TimeoutExpired) as waited:
        subprocess.run([sys.executable, "-c", _HUNG, "wait"], capture_output=True, text=True, timeout=20)
    out = waited.value.stdout
    assert "interrupted" in (out.decode() if isinstance(out, bytes) else out or "")  # it was interrupted, then waited at exit


def test_the_remote_cache_keeps_references_and_scores_per_prompt(tmp_path: Path) -> None:
    """What an interrupted --target-server run keeps: references and the server's rows per
    prompt, read back as written; a line cut by a kill or of another key is dropped with
    one warning and that prompt is asked again; the key leaves out the URL."""
    from specprobe.probe.remote_cache import RemoteCache, run_key

    request = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    key = run_key("vllm", "target", "/models/smollm2", "0.32.0", [[1, 2], [3]], request, 0, 4)
    assert key == run_key("vllm", "target", "/models/smollm2", "0.32.0", [[1, 2], [3]], dict(reversed(request.items())), 0, 4)
    assert key != run_key("vllm", "target", "/models/smollm2", "0.32.0", [[1, 2], [3]], request, 1, 4)  # another seed
    warned: list[str] = []
    c = RemoteCache(tmp_path, key, 2, 100, 4, warned.append)
    c.add_reference(1, [5, 6, 7])
    rows = [{5: (-0.5, 1), 9: (-1.5, 2)}, {6: (-0.25, 1)}, {7: (-3.0, 4), 1: (-0.1, 1)}]
    c.add_scores(1, 20, rows)
    c.add_scores(1, 50, rows[:2])  # a widening answer: the first positions only
    again = RemoteCache(tmp_path, key, 2, 100, 4, warned.append)
    assert again.references() == {1: [5, 6, 7]}
    assert again.scores(20, {1: 3}) == {1: rows}
    assert again.scores(50, {1: 3}) == {1: rows[:2]}
    assert again.scores(5, {1: 3}) == {}
    assert warned == []
    with again.scores_path.open("ab") as fh:
        fh.write(b'{"key": "other", "prompt": 0, "n": 20, "rows": []}\n{"key": "' + key.encode() + b'", "prompt": 0, "n": 20, "rows": [[[5, -0.')
    assert RemoteCache(tmp_path, key, 2, 100, 4, warned.append).scores(20, {0: 1, 1: 3}) == {1: rows}
    assert len(warned) == 1 and "2 damaged or foreign line(s) dropped" in warned[0]
    import shutil

    for lengths, vocab in (({1: 2}, 100), ({1: 3}, 5)):  # rows longer than the reference; ids outside the vocabulary
        copy = tmp_path / f"copy{vocab}"
        copy.mkdir()
        shutil.copy(again.scores_path, copy / again.scores_path.name)
        assert RemoteCache(copy, key, 2, vocab, 4, warned.append).scores(20, lengths) == {}
    assert len(warned) == 3


def test_widening_must_ask_for_more() -> None:
    cfg = DiagnoseConfig(target="", drafter="./d", target_server="http://h:8000", target_widen=10, target_logprobs=20, cost_ratio=0.1, verify_factor=1.0)
    with pytest.raises(ConfigError, match="--target-widen 10 asks no more"):
        refuse(cfg)
    refuse(DiagnoseConfig(target="", drafter="./d", target_server="http://h:8000", target_widen=-1, target_logprobs=20, cost_ratio=0.1, verify_factor=1.0))
