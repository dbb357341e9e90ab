"""Moved to `specprobe.models.tree_attention` (diagnose runs tree rounds too)."""

from specprobe.models.tree_attention import (
    additive,
    ancestor_matrix,
    block_allowed,
    call,
    forward,
    squeeze,
)

__all__ = ["additive", "ancestor_matrix", "block_allowed", "call", "forward", "squeeze"]
