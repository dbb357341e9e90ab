"""Teacher-forced chained drafting for EAGLE and MTP heads, and the drafter base class
every head shares.

Index convention. A head reads the target's state at slot i (the target's hidden state
at position i) together with the next token x_{i+1}; its step-j output at slot i
predicts x_{i+2+j}. specprobe's scorer wants, per depth d, features at position s that
predict token s+d (the depth-d guess made when the drafter has seen the target up to
s−1 and the tokens up to s), so depth d at position s is step d−1 at slot s−1.

Teacher forcing. Step j feeds the head its own step-(j−1) output plus the REFERENCE
token x_{i+1+j} (the token the draft must have guessed for depth j to be reached).
Attention follows what the engines' KV caches hold during a real draft: the query of
step j at slot i (position i+j) sees the first-use entries of its module at slots ≤ i
(the head's pass over the verified tokens, built from the target's states) and the
module's own later entries at slot i only (the draft's earlier steps from that start).
This is EAGLE-3's training-time-test pattern and what vLLM/SGLang compute at inference;
all start positions are drafted in parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from specprobe.drafters.base import Drafter, ModelInfo, TargetPass
from specprobe.models.heads.layout import header_params
from specprobe.models.heads.vocab import map_logits, scoring_vocab, vocab_mask

# Chained heads answer any depth; the scorer asks only for the depths up to its k_max.
MAX_CHAIN = 32


def chain_mask(slots: int, uses: int, dtype: Any, device: Any) -> Any:
    """Additive attention mask [1, 1, S, (uses+1)·S] for a module's (uses+1)-th call:
    a causal block over its first-use entries, then one diagonal block per later use."""
    import torch

    i = torch.arange(slots, device=device)
    neg = torch.finfo(dtype).min
    blocks = [torch.where(i[None, :] <= i[:, None], 0.0, neg)]
    diag = torch.where(i[None, :] == i[:, None], 0.0, neg)
    blocks += [diag] * uses
    return torch.cat(blocks, dim=1).to(dtype)[None, None]


def shifted_tokens(ids: Any, step: int, pad: int = 0) -> Any:
    """[B, S] token fed at each slot on step `step`: x_{i+1+step} (pad past the end)."""
    import torch

    k = 1 + step
    if k >= ids.shape[1]:
        return torch.full_like(ids, pad)
    return torch.cat([ids[:, k:], ids.new_full((ids.shape[0], k), pad)], dim=1)


def slots_to_positions(x: Any) -> Any:
    """Slot i -> scorer position i+1 (position 0 keeps slot 0: it is never a real prediction)."""
    import torch

    return torch.cat([x[:, :1], x[:, :-1]], dim=1)


class ChainedFeatures(Mapping[int, Any]):
    """depth -> [B, S, H'] features, computed lazily and in order: asking for depth d runs
    steps 0..d−1 once. Iterating lists depths 1..limit without computing any."""

    def __init__(self, step: Callable[[int, Any], tuple[Any, Any]], first: Any, limit: int) -> None:
        self._step = step  # (j, hidden from step j−1) -> (hidden for step j+1, features of step j)
        self._hidden = first
        self._feats: list[Any] = []
        self._limit = limit

    def __getitem__(self, depth: int) -> Any:
        if not 1 <= depth <= self._limit:
            raise KeyError(depth)
        while len(self._feats) < depth:
            self._hidden, f = self._step(len(self._feats), self._hidden)
            self._feats.append(slots_to_positions(f))
        return self._feats[depth - 1]

    def __iter__(self) -> Iterator[int]:
        return iter(range(1, self._limit + 1))

    def __len__(self) -> int:
        return self._limit


class HeadDrafter(Drafter):
    """A head over a loaded target: subclasses load their modules in `_build()` (run on
    first use), implement `features(tp)`, `head_logits(features, depth)` ([N, V_draft])
    and, for a draft vocabulary, set `self.ids` (target id of each draft id)."""

    def __init__(self, spec: str, target: Any, info: ModelInfo, layout: Any) -> None:
        super().__init__(spec, target)
        self.layout = layout
        self.kind = layout.kind
        self._info = info
        self.ids: Any = None  # [Vd] target ids, None when draft id = target id
        self._mask: Any = None
        self._scoring_vocab: Any = None
        self._params = 0
        self._built = False
        # Medusa answers one depth per head; chained heads (EAGLE, MTP) any depth
        limit = layout.depths if layout.kind == "medusa" and layout.depths else MAX_CHAIN
        self.head_depths = tuple(range(1, limit + 1))

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def name(self) -> str:
        return f"{self.layout.layout} {self.layout.path.name}"

    @property
    def num_layers(self) -> int | None:
        return self.layout.details.get("num_layers")

    @property
    def params(self) -> int:
        """The head's own parameters (from the tensor headers until the weights are loaded)."""
        return self._params if self._built else header_params(self.layout)

    @property
    def vocab(self) -> int:
        return int(self.target.vocab_size)

    @property
    def target_vocab_mask(self) -> Any:
        """[V] bool of the target ids the head can propose; None when it covers them all."""
        self.ensure_built()
        if self.ids is None:
            return None
        if self._mask is None:
            m = vocab_mask(self.ids, self.vocab)
            self._mask = None if bool(m.all()) else m
        return self._mask

    def ensure_built(self) -> None:
        """Load the weights (once). Deferred to the first forward use so that `diagnose`
        reports the head checks' findings before a broken checkpoint fails to load."""
        if not self._built:
            self._build()
            self._built = True

    def _build(self) -> None:
        raise NotImplementedError

    def hidden(self, tp: TargetPass) -> Mapping[int, Any]:
        self.ensure_built()
        return self.features(tp)

    def features(self, tp: TargetPass) -> Mapping[int, Any]:
        raise NotImplementedError

    def head_logits(self, features: Any, depth: int) -> Any:
        raise NotImplementedError

    def scoring_vocab(self) -> Any:
        """The draft vocabulary as the scorer reads it (`vocab.ScoringVocab`), built once."""
        self.ensure_built()
        if self._scoring_vocab is None:
            self._scoring_vocab = scoring_vocab(self.ids, self.vocab)
        return self._scoring_vocab

    def draft_logits(self, hidden: Any, depth: int) -> Any:
        """[N, H'] -> [N, Vd] logits over the head's own draft vocabulary (the scorer's input)."""
        return self.head_logits(hidden, depth)

    def logits(self, hidden: Any, depth: int) -> Any:
        out = self.head_logits(hidden, depth)
        if self.ids is None:
            return out
        return map_logits(out, self.ids.to(out.device), self.vocab)

    def _count(self, *modules: Any) -> None:
        self._params = sum(p.numel() for m in modules for p in m.parameters())


def rotary_for(config: Any) -> Any:
    """transformers' rotary embedding for a Llama-style config (rope_theta/rope_scaling honoured)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(config=config)


def positions(batch: int, slots: int, step: int, device: Any) -> Any:
    import torch

    return (torch.arange(slots, device=device) + step)[None].expand(batch, -1)
