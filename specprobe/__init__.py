"""specprobe: is this speculative-decoding drafter any good for its target, and why."""

__version__ = "0.1.0"
