"""Recursive equality of two results' dumps within float tolerance (sums added in
another order differ in the last digits)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# when it was made, and the cost measurement's time budget (set from the time scoring took)
SKIP = frozenset({"created", "cap_s", "budget_s", "elapsed_s"})


# Runs that split the prompts another way (shards, torchrun ranks, other batch sizes)
# forward each prompt in a batch of another shape: float32 matmuls blocked by that shape
# differ in the last bits (~1e-7 of each value), and a figure summed over thousands of
# positions in another order differs by ~1e-6 relative (2.3e-6 seen on one CPU). Equal
# up to that, not to 1e-9: 1e-5 leaves the arithmetic's room and still catches a lost or
# doubled prompt (a change of 1e-2 or more).
REL_OTHER_BATCHING = 1e-5


def differences(a: Any, b: Any, path: str = "", rel: float = 1e-9, abs_: float = 1e-9) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only on one side" for k in sorted(set(a) ^ set(b), key=str) if k not in SKIP]
        for k in a.keys() & b.keys():
            if k not in SKIP:
                out += differences(a[k], b[k], f"{path}.{k}", rel, abs_)
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]", rel, abs_)]
    if isinstance(a, float) and isinstance(b, float | int) or isinstance(b, float) and isinstance(a, int):
        if math.isnan(a) and math.isnan(b):
            return []
        return [] if math.isclose(a, b, rel_tol=rel, abs_tol=abs_) else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def whole_and_merged(args: list[str], tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a diagnose command line once whole, then as two shards merged (the parts given
    to merge out of order) -> (the one-shot result, the merged one), both exiting 0."""
    from typer.testing import CliRunner

    from specprobe.cli.main import app

    runner = CliRunner()
    whole = runner.invoke(app, [*args, "--json", str(tmp_path / "whole.json")])
    assert whole.exit_code == 0, whole.output
    for i in range(2):
        r = runner.invoke(app, [*args, "--shard", f"{i}/2", "--json", str(tmp_path / f"part{i}.json")])
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["merge", str(tmp_path / "part1.json"), str(tmp_path / "part0.json"), "--json", str(tmp_path / "merged.json"), "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    one, merged = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("whole", "merged"))
    return one, merged
