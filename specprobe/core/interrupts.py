"""Ctrl-C and SIGTERM during a long run. Both raise KeyboardInterrupt, so the step that
is running stops and keeps what it finished; the orchestration then writes what was
computed and finishes, or, on a second press, stops without the steps that are left.
`shielded` holds a press back while results are being written and raises it after, so
a file is never left half-written and the press is not lost."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _main_thread() -> bool:
    # signal handlers can only be installed from the main thread
    return threading.current_thread() is threading.main_thread()


def _restore(signum: int, handler: Any) -> None:
    signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI timeout, `kill`, a container stopping) behaves like Ctrl-C: the
    run keeps what it computed instead of dying with nothing written."""
    if not _main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        _restore(signal.SIGTERM, old)


@contextmanager
def shielded() -> Iterator[None]:
    """Run the body to its end even when Ctrl-C/SIGTERM arrives; a press that came
    meanwhile is raised as KeyboardInterrupt once the body is done."""
    if not _main_thread():
        yield
        return
    pressed: list[int] = []
    old = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        signal.signal(s, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        for s, h in old.items():
            _restore(s, h)
    if pressed:
        raise KeyboardInterrupt
