"""Metrics: pure tensor functions (`core`), the table choosing which implementation
computes them (`dispatch`), and mergeable accumulators (`accumulate`). Never sees a model
object."""
