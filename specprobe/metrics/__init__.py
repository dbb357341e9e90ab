"""Metrics: pure tensor functions (`core`) and mergeable accumulators (`accumulate`).
Never sees a model object."""
