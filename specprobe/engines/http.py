"""The one HTTP client the engines' server clients share: JSON and text over HTTP with a
timeout on every request, a bounded number of retries with backoff on the answers that
mean "try again" (429, 503, a reset connection), and one-line errors (`ServerError`)
that name the URL and what to check. Standard library only, so a command that talks to a
server imports nothing heavy."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

from specprobe.core.errors import ConfigError, ServerError

RETRY_STATUS = frozenset({429, 502, 503, 504})
T = TypeVar("T")
IN_FLIGHT = 4  # requests at once where an answer stands alone (the server batches them)
RETRIES = 3  # tries after the first, for the answers above and dropped connections
BACKOFF_S = 0.5  # the first wait; doubled each try


def _body_of(e: urllib.error.HTTPError) -> str:
    try:
        text = e.read().decode(errors="replace")
    except Exception:  # noqa: BLE001 - the error body is only for the message
        return ""
    try:
        parsed = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    if isinstance(parsed, dict):
        err = parsed.get("error", parsed.get("detail", parsed.get("message", parsed)))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:300]
    return str(parsed)[:300]


def request(url: str, body: dict[str, Any] | None = None, *, timeout: float = 60.0, retries: int = RETRIES, what: str = "the server") -> bytes:
    """GET (no body) or POST JSON; the raw answer. Retries what is worth retrying, then
    raises ServerError with the status and the server's own message."""
    check_url(url, what)
    data = None if body is None else json.dumps(body).encode()
    wait = BACKOFF_S
    for attempt in range(retries + 1):
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the user's own server
                out: bytes = resp.read()
                return out
        except urllib.error.HTTPError as e:
            if e.code in RETRY_STATUS and attempt < retries:
                time.sleep(wait)
                wait *= 2
                continue
            raise ServerError(f"{what} at {url} answered HTTP {e.code}: {_body_of(e) or e.reason}", "check the request's settings against the server's (model name, max_model_len, max_logprobs)") from None
        except (ConnectionError, TimeoutError, urllib.error.URLError, http.client.IncompleteRead) as e:
            # an answer cut off part way (the server died while sending it) is a dropped
            # connection too: http.client raises IncompleteRead, no OSError
            reason = "its answer was cut off: IncompleteRead" if isinstance(e, http.client.IncompleteRead) else getattr(e, "reason", e)
            if attempt < retries:
                time.sleep(wait)
                wait *= 2
                continue
            raise ServerError(f"{what} at {url} did not answer ({reason})", "check that the server is running and the URL (scheme, host, port) is right") from None
    raise AssertionError("unreachable")  # pragma: no cover


def check_url(url: str, what: str = "the server") -> None:
    """An http(s) URL with a host, or a one-line error now (no retries on a typo)."""
    try:
        parts = urllib.parse.urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"{url!r} is not a URL {what} can be reached at", "write it as http://HOST:PORT, e.g. http://127.0.0.1:8000")


def served_model(url: str, model: str | None, *, timeout: float, what: str) -> tuple[str, dict[str, Any]]:
    """The model an OpenAI-compatible server (`url`) serves that the run asks for (`model`;
    None: its one model) and its /v1/models card; a one-line ConfigError naming what it
    serves otherwise."""
    check_url(url, what)
    listed = get_json(url + "/v1/models", timeout=timeout, what=what)
    entries = [m for m in (listed.get("data") or []) if isinstance(m, dict)] if isinstance(listed, dict) else []
    served = [str(m.get("id")) for m in entries]
    if model is None:
        if len(served) != 1:
            raise ConfigError(f"the server at {url} serves {len(served)} models ({', '.join(served) or 'none'})", "name one with --against-model (--target-model with --target-server)")
        model = served[0]
    elif model not in served:
        raise ConfigError(f"the server at {url} does not serve {model!r} (it serves {', '.join(served) or 'nothing'})", "pass one of its models with --against-model (--target-model with --target-server)")
    return model, next(m for m in entries if str(m.get("id")) == model)


def get_json(url: str, *, timeout: float = 30.0, what: str = "the server") -> Any:
    return _parse(request(url, timeout=timeout, what=what), url, what)


def post_json(url: str, body: dict[str, Any], *, timeout: float = 600.0, what: str = "the server") -> Any:
    return _parse(request(url, body, timeout=timeout, what=what), url, what)


def post_json_sized(url: str, body: dict[str, Any], *, timeout: float = 600.0, what: str = "the server") -> tuple[Any, int]:
    """post_json, and how many bytes the answer took (for the cost of a scoring run)."""
    raw = request(url, body, timeout=timeout, what=what)
    return _parse(raw, url, what), len(raw)


def get_text(url: str, *, timeout: float = 30.0, what: str = "the server") -> str:
    return request(url, timeout=timeout, what=what).decode(errors="replace")


def _parse(raw: bytes, url: str, what: str) -> Any:
    try:
        return json.loads(raw.decode())
    except ValueError:
        raise ServerError(f"{what} at {url} answered something that is not JSON ({raw[:80]!r})", "is this the engine's HTTP API? check the URL and port") from None


def in_order(ask: Callable[[int], T], items: Iterable[int], in_flight: int = IN_FLIGHT, *, leave_behind: bool = False) -> Generator[T, None, None]:
    """ask(i) for every item, up to `in_flight` requests at once, each in a thread of its
    own, answers in the items' order. Leaving early (an error, Ctrl-C) sends nothing more.
    The requests then in flight finish before the process exits, or with `leave_behind`
    (for an `ask` that only waits on a server) are left behind, so that an exit does not
    wait for answers a request timeout away. Not for an `ask` that runs torch: a thread
    cut off at exit in the middle of it can abort the process."""
    pending: deque[Future[T]] = deque()
    it = iter(items)

    def start(i: int) -> Future[T]:
        fut: Future[T] = Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(ask(i))
            except Exception as e:  # noqa: BLE001 - handed to the caller, which re-raises it in order
                fut.set_exception(e)

        threading.Thread(target=run, name=f"specprobe-request-{i}", daemon=leave_behind).start()
        return fut

    try:
        for i in it:
            pending.append(start(i))
            if len(pending) >= in_flight:
                break
        while pending:
            got = pending.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(start(nxt))
            yield got
    finally:
        for fut in pending:
            fut.cancel()  # one not yet running is never run
