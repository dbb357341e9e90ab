"""What several benchmarks share: the batch they time the scorers on."""

from __future__ import annotations

from typing import Any


def builtin_batch(tokenizer: Any, n: int = 8, cut: int = 96) -> tuple[Any, Any]:
    """The first n built-in prompts, each cut to `cut` tokens, right-padded into one
    batch -> (ids [n, S], attention mask [n, S])."""
    import torch

    from specprobe.probe.references import encode_prompt
    from specprobe.prompts import builtin_suite, select

    seqs = [encode_prompt(tokenizer, p)[:cut] for p in select(builtin_suite(), max_prompts=n).prompts]
    ids = torch.full((len(seqs), max(len(s) for s in seqs)), tokenizer.pad_token_id or 0)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask
