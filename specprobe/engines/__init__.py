"""The serving engines specprobe speaks for, one package each: vLLM (`vllm/`), SGLang
(`sglang/`), llama.cpp's llama-server (`llamacpp/`), TensorRT-LLM (`trtllm/`) and
transformers' assisted generation (`transformers/`).

Each engine's package holds what that engine means (`base.Engine` says what an engine
answers). The rest of specprobe asks `get(name)` and never compares engine names.
Adding an engine is one new package here, its entry in ENGINES and its tests.
"""

from __future__ import annotations

from specprobe.core.errors import ConfigError
from specprobe.engines import llamacpp, sglang, transformers, trtllm, vllm
from specprobe.engines.base import DRAFT_SAMPLING, GREEDY, PROBABILISTIC, Engine, SamplingOrder

__all__ = ["DEFAULT", "DEFAULT_SEMANTICS", "DRAFT_SAMPLING", "ENGINES", "GREEDY", "NAMES", "PROBABILISTIC", "SEMANTICS", "Engine", "SamplingOrder", "get", "sampling_order"]

# in the order the choice lists and docs show them; the first is the default
ENGINES: tuple[Engine, ...] = (vllm.ENGINE, sglang.ENGINE, llamacpp.ENGINE, trtllm.ENGINE, transformers.ENGINE)
_BY_NAME = {e.name: e for e in ENGINES}
NAMES: tuple[str, ...] = tuple(_BY_NAME)
# the sampling transforms (`--sampling-semantics`): one per engine that has its own
_ORDERS = {e.sampling.name: e.sampling for e in ENGINES}
SEMANTICS: tuple[str, ...] = tuple(_ORDERS)
DEFAULT, DEFAULT_SEMANTICS = NAMES[0], ENGINES[0].sampling.name


def eagle3_engine(fmt: str) -> Engine:
    """The engine whose EAGLE-3 capture convention a head checkpoint's format was made for."""
    return next((e for e in ENGINES if e.eagle3_format == fmt), None) or next(e for e in ENGINES if e.eagle3_default_for_other_formats)


def ngram_engine(type_name: str) -> Engine:
    """The engine whose n-gram drafting a drafter type is (`drafters/ngram.py`)."""
    return next((e for e in ENGINES if type_name in e.ngram_types), None) or next(e for e in ENGINES if e.ngram_default)


def get(name: str) -> Engine:
    """The engine called `name` (as --engine takes it)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(f"engine {name!r} is not one of {', '.join(NAMES)}", "use --engine " + " | ".join(NAMES)) from None


def sampling_order(name: str) -> SamplingOrder:
    """The sampling transform called `name` (as --sampling-semantics takes it)."""
    try:
        return _ORDERS[name]
    except KeyError:
        raise ConfigError(f"sampling semantics {name!r} is not one of {', '.join(SEMANTICS)}", "use --sampling-semantics " + " | ".join(SEMANTICS)) from None
