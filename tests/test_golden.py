"""Golden files: what the demo and three held-in configs produce — result JSON, reports,
console text and exit codes — recorded so that a refactor can show it changed none of it.

Each case runs the real CLI in-process (typer's CliRunner) on the real SmolLM2 GGUF, with
its outputs in a temporary folder, and compares every artifact with
tests/data/golden/<case>/. The held-in configs are copies of files in sample_configs/, one
per engine whose procedure they predict:

  vllm      probe-smollm2.yaml (engine: vllm; serving configs sglang-launch.yaml and
            vllm-speculative-config.json): check, diagnose, report, export
  sglang    sglang-launch.yaml as the serving config (its engine, K and temperature 1.0;
            diagnosed with sampled drafts, see `case_sglang`)
  llamacpp  llama-server-launch.sh as the serving config (llama.cpp's procedure, min_p)
            with the GGUF itself as an independent drafter, so that export writes configs

Made deterministic rather than normalised wherever the CLI allows: --cost-ratio and
--verify-factor are given, so nothing is timed (the demo takes neither: its default config
is given them, see `_demo_untimed`); --device cpu --dtype float32; the configs' own seeds;
one torch thread (a reduction's order, and so a sampled reference token, can depend on the
thread count). Prompt counts and lengths are cut down so that the whole file runs in about
two minutes; the settings are otherwise the configs' own. What is still machine- or
run-dependent is normalised by `normalise_json` and `normalise_text`, one place each.

Regenerate (after a deliberate change of behaviour, never to make a refactor pass):
    SPECPROBE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from tests.conftest import requires_smollm2

pytestmark = [pytest.mark.slow, requires_smollm2, pytest.mark.usefixtures("one_torch_thread")]

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
SAMPLES = Path(__file__).resolve().parent.parent / "sample_configs"
UPDATE = os.environ.get("SPECPROBE_UPDATE_GOLDEN") == "1"

# Given, so that no cost is timed: a round costs (1 + K·c)·v target steps.
COST = ["--cost-ratio", "0.25", "--verify-factor", "1.1"]
CPU = ["--device", "cpu", "--dtype", "float32"]
SMALL = ["--max-prompts", "4", "--max-new-tokens", "12"]
ENGINES = ("vllm", "sglang", "llama.cpp")

# Floats (JSON numbers, and numbers in text reports) are compared with this tolerance, not
# as strings: the models run in float32, whose sums change in the last bits with the
# order of a reduction (another BLAS, CPU or torch build), ~1e-7 relative per operation
# and a few 1e-6 after a layer stack; 1e-5 allows that and nothing a change of behaviour
# would produce. Integers, strings and booleans are compared exactly.
REL, ABS = 1e-5, 1e-9

# JSON paths dropped from every result before it is compared or recorded ("*" is any key
# or list index; in the demo's file, each applies to every row, rows.*.PATH), each for the
# reason given. Nothing else is dropped: with the costs given, no other timing reaches a
# result (its cost section says measured: false and holds no milliseconds).
DROPPED: dict[str, str] = {
    "created": "the date and time of the run",
    "specprobe_version": "the release, not the behaviour",
    "environment": "torch/transformers/package versions, Python, platform: the machine",
    "cost.budget_s": "the timing budget, made from the scoring's wall time (recorded though nothing is timed)",
    "cost.cap_s": "the timing cap, made from the scoring's wall time likewise",
}
# Substrings of text (and of JSON strings) replaced before comparing: paths that are the
# test's temporary folders, this checkout or the built-in GGUF's install, and dates.
DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?")


def _matches(pattern: list[str], path: list[str]) -> bool:
    return len(pattern) == len(path) and all(p in ("*", q) for p, q in zip(pattern, path, strict=True))


def _dropped(path: list[str]) -> bool:
    return any(_matches(p.split("."), path) or _matches(["rows", "*", *p.split(".")], path) for p in DROPPED)


def normalise_json(obj: Any, roots: dict[str, str], path: list[str] | None = None) -> Any:
    """A result with the DROPPED paths removed and its strings passed through
    `normalise_text` (temporary paths, dates)."""
    path = path or []
    if isinstance(obj, dict):
        return {k: normalise_json(v, roots, path + [k]) for k, v in obj.items() if not _dropped(path + [k])}
    if isinstance(obj, list):
        return [normalise_json(v, roots, path + [str(i)]) for i, v in enumerate(obj)]
    if isinstance(obj, str):
        return normalise_text(obj, roots)
    return obj


def normalise_text(text: str, roots: dict[str, str]) -> str:
    """Text with each root folder (the test's temporary outputs, the cache, this checkout)
    written as its <NAME>, and ISO dates as <DATE> (JUnit's timestamp, a report's date)."""
    for name, root in sorted(roots.items(), key=lambda kv: -len(kv[1])):  # the longest first
        text = text.replace(root, f"<{name}>")
    return DATE.sub("<DATE>", text)


NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=ABS) or (math.isnan(a) and math.isnan(b))


def assert_same_json(got: Any, want: Any, where: str) -> None:
    if isinstance(want, dict) and isinstance(got, dict):
        assert sorted(got) == sorted(want), f"{where}: keys differ: {sorted(set(got) ^ set(want))}"
        for k in want:
            assert_same_json(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), f"{where}: {len(got)} items, golden {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_json(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        assert _close(float(got), want), f"{where}: {got!r}, golden {want!r}"
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r}, golden {want!r}"


def assert_same_text(got: str, want: str, where: str) -> None:
    """Equal text, but for decimal numbers, which are compared within REL."""
    g_parts, w_parts = NUMBER.split(got), NUMBER.split(want)
    g_nums, w_nums = NUMBER.findall(got), NUMBER.findall(want)
    if g_parts != w_parts or len(g_nums) != len(w_nums):
        import difflib

        diff = "".join(list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "now"))[:80])
        raise AssertionError(f"{where} differs:\n{diff}")
    for g, w in zip(g_nums, w_nums, strict=True):
        assert _close(float(g), float(w)), f"{where}: {g}, golden {w}"


class Run:
    """One case's commands, run in its temporary folder; what they print and write is
    collected as artifacts (path -> JSON value or text), normalised."""

    def __init__(self, folder: Path, cache: Path) -> None:
        self.folder = folder
        from specprobe.models.loader import builtin_gguf_path

        # the built-in's GGUF, which llama.cpp's export names: where its wheel is installed
        self.roots = {"TMP": str(folder), "CACHE": str(cache), "REPO": str(SAMPLES.parent), "SMOLLM2_GGUF": str(builtin_gguf_path("smollm2"))}
        self.artifacts: dict[str, Any] = {}
        self.exits: list[dict[str, Any]] = []
        self.runner = CliRunner()

    def __call__(self, name: str, *args: str, stderr: bool = False) -> int:
        """Run one command; its exit code and stdout are kept, and its stderr when asked
        (not for commands that load models: their progress bars carry times)."""
        cwd = os.getcwd()
        os.chdir(self.folder)  # relative paths in the commands are this folder's
        try:
            res = self.runner.invoke(app, list(args))
        finally:
            os.chdir(cwd)
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            raise res.exception
        self.exits.append({"name": name, "args": [normalise_text(a, self.roots) for a in args], "exit_code": res.exit_code})
        self.artifacts[f"{name}.stdout.txt"] = normalise_text(res.stdout, self.roots)
        if stderr:
            self.artifacts[f"{name}.stderr.txt"] = normalise_text(res.stderr, self.roots)
        return res.exit_code

    def collect(self, *names: str) -> None:
        """Files (or every file under folders) the commands wrote, relative to the folder."""
        for n in names:
            p = self.folder / n
            files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
            for f in files:
                rel = str(f.relative_to(self.folder))
                text = f.read_text(encoding="utf-8")
                self.artifacts[rel] = normalise_json(json.loads(text), self.roots) if f.suffix == ".json" else normalise_text(text, self.roots)

    def exports(self, result: str) -> None:
        """export --engine for each engine, from the saved result (no torch): stdout is
        the config, stderr the prediction it rests on or why it is refused."""
        for engine in ENGINES:
            self(f"export-{engine}", "export", result, "--engine", engine, stderr=True)


def _copy_samples(folder: Path, *names: str) -> Path:
    cfg = folder / "cfg"
    cfg.mkdir()
    for n in names:
        shutil.copy(SAMPLES / n, cfg / n)
    return cfg


def _demo_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`specprobe demo` has no --cost-ratio: give its default config one, and a verify
    factor, as the held-in configs are given them, so that nothing depends on timing."""
    import specprobe.probe.demo as demo

    made = demo.default_config
    monkeypatch.setattr(demo, "default_config", lambda **kw: replace(made(**kw), cost_ratio=0.25, verify_factor=1.1))


def case_demo(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    _demo_untimed(monkeypatch)
    run("demo", "demo", "--max-prompts", "2", "--max-new-tokens", "8", *CPU, "--json", "demo.json")
    run.collect("demo.json")


def case_vllm(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    _copy_samples(run.folder, "probe-smollm2.yaml", "sglang-launch.yaml", "vllm-speculative-config.json")
    run("check", "check", "--config", "cfg/probe-smollm2.yaml", "--json", "check.json")
    # its outputs (json, html, junit, markdown, csv) go to ../out, relative to the config
    run("diagnose", "diagnose", "--config", "cfg/probe-smollm2.yaml", *SMALL, *COST, *CPU)
    run("report", "report", "out/candidate.json", "--markdown", "report/summary.md", "--junit", "report/junit.xml")
    run.exports("out/candidate.json")
    run.collect("check.json", "out/candidate.json", "out/junit.xml", "out/summary.md", "out/csv", "report")


def _serving_case(run: Run, script: str, drafter: str, *diagnose: str) -> None:
    _copy_samples(run.folder, script)
    pair = ["smollm2", drafter, "--serving-config", f"cfg/{script}"]
    run("check", "check", *pair, "--json", "check.json")
    outs = ["--json", "r.json", "--markdown", "r.md", "--junit", "junit.xml", "--csv", "csv"]
    run("diagnose", "diagnose", *pair, *diagnose, *SMALL, *COST, *CPU, *outs)
    run.exports("r.json")
    run.collect("check.json", "r.json", "r.md", "junit.xml", "csv")


def case_sglang(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    # Sampled drafts: SGLang's greedy drafts make a tree run, whose tree passes are timed
    # within a 2-second cap even when the costs are given, so its timing repeats (and
    # SP306 cost-timing-short) depend on the machine. check reads the file as it is.
    _serving_case(run, "sglang-launch.yaml", "self:layers=28", "--draft-sampling", "probabilistic")


def case_llamacpp(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    # an independent drafter model, as the script's -md is (and so one the engines can serve)
    _serving_case(run, "llama-server-launch.sh", "smollm2")


CASES = {"demo": case_demo, "vllm": case_vllm, "sglang": case_sglang, "llamacpp": case_llamacpp}


def _golden_files(folder: Path) -> Iterator[Path]:
    yield from sorted(f for f in folder.rglob("*") if f.is_file())


def _write(folder: Path, run: Run) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    for rel, value in {**run.artifacts, "exit_codes.json": run.exits}.items():
        f = folder / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(value if isinstance(value, str) else json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


@pytest.mark.parametrize("case", list(CASES))
def test_golden(case: str, tmp_path: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")  # the console's tables fit the width they print at
    # --gguf-weights auto keeps a GGUF quantised when memory is short *now*: on a loaded
    # machine that adds a "served quantized" line and `quant` sections. Pin it to plenty of
    # memory, so the files do not depend on what else the machine runs.
    import specprobe.models.loader as loader

    monkeypatch.setattr(loader, "available_memory", lambda: 64 << 30)
    run = Run(tmp_path, session_cache)
    CASES[case](run, monkeypatch)
    folder = GOLDEN / case
    if UPDATE:
        _write(folder, run)
        return
    assert folder.is_dir(), f"no golden files for {case}: SPECPROBE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py"
    got = {**run.artifacts, "exit_codes.json": run.exits}
    want_names = sorted(str(f.relative_to(folder)) for f in _golden_files(folder))
    assert sorted(got) == want_names, f"{case}: artifacts differ: {sorted(set(got) ^ set(want_names))}"
    for rel in want_names:
        text = (folder / rel).read_text(encoding="utf-8")
        if rel.endswith(".json"):
            assert_same_json(got[rel], json.loads(text), f"{case}/{rel}")
        else:
            assert_same_text(got[rel], text, f"{case}/{rel}")
