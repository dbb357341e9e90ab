"""What several benchmarks share: their command-line parser, the batch they time the
scorers on, the child script that times one specprobe command."""

from __future__ import annotations

import argparse
from typing import Any


def int_options(ap: argparse.ArgumentParser, **defaults: int) -> argparse.ArgumentParser:
    """An integer option --name (underscores as dashes) per keyword, with its default, in
    the order given -> the parser."""
    for name, default in defaults.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    return ap


def parser(doc: str | None, **defaults: int) -> argparse.ArgumentParser:
    """A benchmark's parser: its docstring, as written, for --help, and `int_options`."""
    return int_options(argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter), **defaults)


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


# A specprobe command (its arguments after the script's) run in this child, which prints
# `BENCH {"wall_s": …, "rss_mb": …}` (its wall time and peak RSS).
CLI_CHILD = r"""
import json, resource, sys, time
from specprobe.core.openmp import shorten_spin
shorten_spin()
from specprobe.cli.main import app
t0 = time.perf_counter()
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
print("BENCH " + json.dumps({"wall_s": time.perf_counter() - t0, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
