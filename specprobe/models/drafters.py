"""Drafters over a loaded target.

Every drafter answers one question for teacher-forced scoring: given the reference
sequence and the target's outputs on it, what are the drafter's logits at depth d for
each position (the prediction of token t+d made at position t)? Autoregressive drafters
(an independent LM, a layer-skip self-draft) answer only depth 1 and the estimator chains
depth-1 predictions along the reference; head-style drafters (Medusa, MTP, EAGLE) read
target hidden states and answer each depth they were trained for.

Specs:  self                 the target itself (sanity check: α = 1)
        self:layers=N        first N decoder layers + final norm + LM head, shared weights
        PATH | smollm2       an independent causal LM (checkpoint folder or GGUF)
        eagle3:PATH | eagle:PATH | medusa:PATH | mtp | a head's folder
                             a head drafter (specprobe.models.heads)
        ngram[:…] | ngram-simple | ngram-map-k | ngram-map-k4v | ngram-mod | ngram-cache
                             an engine's n-gram drafter, no model (specprobe.drafters.ngram)
"""

from __future__ import annotations

import re
from typing import Any

from specprobe.core.delegate import Via
from specprobe.core.errors import ConfigError
from specprobe.drafters.base import Drafter, ModelInfo, TargetPass
from specprobe.drafters.ngram import NgramDrafter, is_ngram_spec
from specprobe.drafters.ngram_mix import MixedDrafter, check_mixed, is_mixed_spec
from specprobe.models.anatomy import decoder_layers, final_norm, layer_view
from specprobe.models.heads import build_head, head_info, head_kind
from specprobe.models.loader import LoadedModel, load_info, load_model


class _OnTarget(Drafter):
    """A drafter made of the target's own weights (nothing of its own to count): the
    target's facts, its LM head."""

    info = Via[ModelInfo]("target")

    @property
    def params(self) -> int:
        return 0  # shared with the target

    def logits(self, hidden: Any, depth: int) -> Any:
        return self.target.head(hidden)


class SelfDrafter(_OnTarget):
    """The target itself: every distribution equal; the sanity row."""

    kind = "independent"

    num_layers = Via[int]("target")

    @property
    def name(self) -> str:
        return f"{self.target.name} (itself)"

    def hidden(self, tp: TargetPass) -> dict[int, Any]:
        return {1: tp.last_hidden}

    def step_model(self) -> Any:
        return self.target.model


class LayerSkipDrafter(_OnTarget):
    """First N target layers + final norm + LM head (LayerSkip / Draft&Verify), sharing the
    target's weights in memory: nothing is copied."""

    kind = "layer_skip"

    def __init__(self, spec: str, target: LoadedModel, n_layers: int) -> None:
        super().__init__(spec, target)
        total = target.num_layers
        if not 1 <= n_layers < total:
            raise ConfigError(
                f"self:layers={n_layers} is out of range for {target.name}, which has {total} decoder layers",
                f"use 1 ≤ N < {total} (or 'self' for the full target)",
            )
        # where the decoder layers and the final norm live (ModelLoadError when not found)
        decoder_layers(target.model)
        self._norm = final_norm(target.model)
        self.n_layers = n_layers
        self._step: Any = None

    @property
    def name(self) -> str:
        return f"{self.target.name} first {self.n_layers}/{self.target.num_layers} layers"

    @property
    def num_layers(self) -> int:
        return self.n_layers

    def target_layers_needed(self) -> tuple[int, ...]:
        return (self.n_layers,)

    def hidden(self, tp: TargetPass) -> dict[int, Any]:
        # hidden_states[N] is the raw output of layer N; the self-draft normalises it.
        return {1: self._norm(tp.layer_hidden[self.n_layers])}

    def step_model(self) -> Any:
        """A real transformers causal LM of N layers whose modules are the target's own."""
        if self._step is None:
            self._step = layer_view(self.target.model, self.n_layers)
        return self._step


class IndependentDrafter(Drafter):
    """A separate causal LM. Its logits are compared id by id with the target's, as the
    engines do; extra padded rows are dropped, missing ones count as probability 0."""

    kind = "independent"

    def __init__(self, spec: str, target: LoadedModel, loaded: LoadedModel) -> None:
        super().__init__(spec, target)
        self.loaded = loaded

    info = Via[ModelInfo]("loaded")
    name = Via[str]("loaded")
    num_layers = Via[int]("loaded")
    params = Via[int]("loaded")

    def hidden(self, tp: TargetPass) -> dict[int, Any]:
        return {1: self.loaded.last_hidden(tp.input_ids, tp.attention_mask)}

    def logits(self, hidden: Any, depth: int) -> Any:
        return self.loaded.head(hidden)

    def step_model(self) -> Any:
        return self.loaded.model


_LAYERS_RE = re.compile(r"^self:layers=(-?\d+)$")


def drafter_kind_of(spec: str) -> str:
    if is_ngram_spec(spec) or is_mixed_spec(spec):
        return NgramDrafter.kind
    if spec == "self":
        return "independent"
    if spec.startswith("self:"):
        return "layer_skip"

    return head_kind(spec) or "independent"


def parse_self_spec(spec: str) -> int | None:
    """N for 'self:layers=N', None for 'self'; raises on a malformed self spec."""
    if spec == "self":
        return None
    m = _LAYERS_RE.match(spec)
    if not m:
        raise ConfigError(f"drafter spec {spec!r} is not understood", "use 'self', 'self:layers=N', a checkpoint folder, a .gguf file or 'smollm2'")
    return int(m.group(1))


def drafter_info(spec: str, target_info: ModelInfo, progress: Any = None, gguf_weights: str = "auto") -> ModelInfo:
    """The drafter's tokenizer/config for `check` (no weights)."""
    if is_mixed_spec(spec):  # n-gram types beside a draft model: the model's, checked against the target
        _, model = check_mixed(spec)
        return drafter_info(model, target_info, progress, gguf_weights)
    if is_ngram_spec(spec):
        NgramDrafter(spec)  # a bad spec is refused here, before anything loads
        return target_info  # it drafts the target's own tokens
    if spec == "self" or spec.startswith("self:"):
        if spec != "self":
            n = parse_self_spec(spec)
            total = int(target_info.config.num_hidden_layers)
            if n is None or not 1 <= n < total:
                raise ConfigError(f"{spec} is out of range for a target with {total} decoder layers", f"use 1 ≤ N < {total}")
        return target_info

    return head_info(spec, target_info) or load_info(spec, progress, gguf_weights)


def build_drafter(spec: str, target: LoadedModel, device: str = "auto", dtype: str = "auto", progress: Any = None, info: ModelInfo | None = None) -> Drafter | NgramDrafter | MixedDrafter:
    if is_mixed_spec(spec):  # llama.cpp's n-gram types beside a draft model (drafters.ngram_mix)
        ngram, model = check_mixed(spec)
        return MixedDrafter(spec, NgramDrafter(ngram.spec, info=target.info), build_drafter(model, target, device, dtype, progress, info))
    if is_ngram_spec(spec):
        return NgramDrafter(spec, info=target.info)
    if spec == "self":
        return SelfDrafter(spec, target)
    if spec.startswith("self:"):
        n = parse_self_spec(spec)
        assert n is not None
        return LayerSkipDrafter(spec, target, n)

    head = info if info is not None and "head" in info.extra else head_info(spec, target.info)
    if head is not None:
        return build_head(spec, target, head)
    loaded = load_model(spec, device=target.device if device == "auto" else device, dtype=dtype, progress=progress, info=info)
    return IndependentDrafter(spec, target, loaded)
