"""llama.cpp's lists that mix n-gram types with a draft model: `--spec-type
ngram-simple,draft-simple -md draft.gguf` (and any other ngram-* types beside it), as
llama-server 0.3.36's vendored llama.cpp runs them (common/speculative.cpp).

The order. `common_speculative_init` adds the enabled types in one fixed priority order —
ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache, then the model drafters
(draft-simple, …) — whatever order --spec-type lists them in. Each step
`common_speculative_draft` asks them in that order and the first whose draft is not empty
drafts (cut to the slot's n_max = remaining − 1): the draft model drafts only when no
n-gram type did. Its draft (`common_speculative_impl_draft_simple::draft`): from the token
just sampled, the draft model's top token again and again, stopping before a token whose
probability is under --spec-draft-p-min (default 0), after --spec-draft-n-max tokens
(default 3) or at the slot's n_max; a draft shorter than --spec-draft-n-min (default 0) is
dropped. The draft model takes in every batch the target decodes (`process`), so it is
caught up whoever drafted. The verify step's accepted count goes to the type that drafted
(`impl_last`); the others are told with is_other, which every n-gram type ignores — so the
n-gram types' own state (ngram-map's accepted lengths, ngram-mod's low-acceptance streak)
moves only with their own drafts, as in a list without a model.

The spec: the n-gram types (a llama.cpp comma list, `drafters.ngram`), `+`, then the model
drafter's own spec (a checkpoint folder, a .gguf, a built-in name, `self:layers=N`), e.g.
`ngram-simple:size_n=4,ngram-mod+./draft.gguf`. The model's n_max is the run's K."""

from __future__ import annotations

import copy
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.drafters.ngram import LLAMA_CPP_ORDER, NgramDrafter, is_ngram_spec
from specprobe.engines import ENGINES

SEP = "+"
HINT = "write the llama.cpp n-gram types, '+', then the draft model: e.g. ngram-simple,ngram-mod+./draft.gguf"


def split_mixed(spec: str) -> tuple[str, str] | None:
    """'ngram types+model' -> (the n-gram spec, the model spec), or None when it is not one."""
    if SEP not in spec:
        return None
    left, _, right = spec.partition(SEP)
    if not is_ngram_spec(left.strip()):
        return None
    return left.strip(), right.strip()


def is_mixed_spec(spec: str) -> bool:
    return split_mixed(spec) is not None


def check_mixed(spec: str) -> tuple[NgramDrafter, str]:
    """The n-gram part (parsed) and the model's spec; ConfigError when the mix is not one
    llama.cpp runs."""
    parts = split_mixed(spec)
    if parts is None:
        raise ConfigError(f"drafter spec {spec!r} is not n-gram types beside a draft model", HINT)
    left, right = parts
    ngram = NgramDrafter(left)
    if any(t.name not in LLAMA_CPP_ORDER for t in ngram.types):
        raise ConfigError(f"drafter spec {spec!r}: only llama.cpp lists a draft model beside n-gram types ({ngram.types[0].name} is {ngram.engine}'s)", "use llama.cpp's ngram-* types before the '+'")
    if not right:
        raise ConfigError(f"drafter spec {spec!r} names no draft model after the '+'", HINT)
    if SEP in right or is_ngram_spec(right):
        raise ConfigError(f"drafter spec {spec!r}: one draft model after the '+', not {right!r}", HINT)
    return ngram, right


class MixedDrafter:
    """An n-gram list (`NgramDrafter`) and a causal-LM drafter, tried in llama.cpp's order
    (module doc). `kind` is the n-gram drafters' (diagnose walks it along the references)."""

    kind = "ngram"

    def __init__(self, spec: str, ngram: NgramDrafter, model: Any) -> None:
        self.spec = spec
        self.ngram = ngram
        self.model = model  # a drafters.base.Drafter with a step model (draft-simple)
        self.info = getattr(model, "info", None)
        self.engine = next(e.name for e in ENGINES if e.ngram_with_draft_model)
        self.model_k: int | None = None  # the model's n_max in a simulate run (`with_k`)
        if model.step_model() is None:
            raise ConfigError(f"drafter spec {spec!r}: {model.name} is a head, not a draft model", "llama.cpp's draft-simple beside n-gram types runs a causal LM (-md draft.gguf)")

    @property
    def name(self) -> str:
        return f"{self.ngram.name}{SEP}{self.model.name}"

    @property
    def num_layers(self) -> int | None:
        return getattr(self.model, "num_layers", None)

    @property
    def params(self) -> int | None:
        return getattr(self.model, "params", None)

    @property
    def is_tree(self) -> bool:
        return False

    def reset(self) -> None:
        self.ngram.reset()

    def with_k(self, k: int) -> MixedDrafter:
        """The same drafter with the model's --spec-draft-n-max = k (one simulate run)."""
        out = copy.copy(self)
        out.model_k = k
        return out

    def width(self, k: int) -> int:
        """The longest draft a step makes when the model drafts at most k."""
        return max(self.ngram.max_draft(), k)

    def step_model(self) -> Any:
        return self.model.step_model()
