"""Helpers the tests share: tiny checkpoints, head layouts, the llama.cpp server, and
stopping the servers a test starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def engine_cache(env: str, name: str) -> Path:
    """Where a peer engine built or installed by benchmarks/ lies: `$env`, else
    ~/.cache/specprobe/<name> (or under $XDG_CACHE_HOME)."""
    given = os.environ.get(env)
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "specprobe" / name


def stop(proc: subprocess.Popen, timeout: float) -> None:  # type: ignore[type-arg]
    """Ask a server to stop; kill it when it does not within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def runs_without(commands: list[list[str]], heavy: tuple[str, ...], *, block_torch: bool = False, setup: str = "") -> None:
    """Run specprobe commands in a fresh interpreter and assert none of `heavy` was
    imported (with `block_torch`, `import torch` fails outright). `setup` is Python run
    first; a command's items may name variables it sets."""
    code = "import sys\n" + ("sys.modules['torch'] = None  # import torch now raises ImportError\n" if block_torch else "")
    code += "from typer.testing import CliRunner\nfrom specprobe.cli.main import app\n" + setup
    for args in commands:
        code += f"r = CliRunner().invoke(app, [{', '.join(args)}])\nassert r.exit_code == 0, r.output\n"
    code += f"print('HEAVY:' + ','.join(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY:\n" in proc.stdout, proc.stdout
