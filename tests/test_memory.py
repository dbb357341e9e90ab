"""Out-of-memory backoff (the exception injected): the chunk is halved, then the batch
split, the run goes on and gives the same scores, and says what it did; the chunk size
from free memory for 128k–256k vocabularies."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from specprobe.probe.memory import Backoff, chunk_for, is_oom
from tests.helpers.same import differences


def _oom() -> BaseException:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB") if hasattr(torch.cuda, "OutOfMemoryError") else RuntimeError("CUDA out of memory")


def test_chunk_from_free_memory() -> None:
    gib = 1 << 30
    assert chunk_for(49_152, "cpu", 64) == 64  # CPU: the cache-sized default
    assert chunk_for(128_256, "cuda:0", 64, free_bytes=80 * gib) == 2048  # capped
    assert chunk_for(256_000, "cuda:0", 64, free_bytes=4 * gib) == 128  # 1 GiB / (256k × 4 B × 8)
    assert chunk_for(256_000, "cuda:0", 64, free_bytes=10 << 20) == 8  # never below the floor
    assert is_oom(_oom()) and not is_oom(ValueError("out of range"))


def test_backoff_halves_the_chunk_then_splits_the_batch() -> None:
    calls, done = [], []

    def attempt(idx: list[int], chunk: int) -> int:
        calls.append((tuple(idx), chunk))
        if chunk > 1 or len(idx) > 1:
            raise _oom()
        return idx[0]

    b = Backoff(4)
    assert b.run([1, 2, 3], attempt, lambda: done.append(1)) == [1, 2, 3]
    assert b.chunk == 1 and len(done) == 3
    assert any("halved to 1" in n for n in b.notes) and any("split in two" in n for n in b.notes)
    with pytest.raises(ValueError):
        Backoff(4).run([1], lambda i, c: (_ for _ in ()).throw(ValueError("not memory")), lambda: None)


def test_injected_oom_during_scoring_keeps_the_scores(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specprobe.estimates import estimate
    from specprobe.probe import scoring
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl", n=4)
    cfg = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(pf), max_new_tokens=8, batch_size=4, k_max=3, cost_ratio=0.1, verify_factor=1.0, sampling=SamplingFlags(temperature=1.0), device="cpu")
    plain = run_diagnose(cfg)
    real = scoring.score_batch
    seen: list[tuple[int, int]] = []

    def tight(target: Any, drafter: Any, idx: list[int], *a: Any) -> Any:
        c = a[-2].chunk_positions
        seen.append((len(idx), c))
        if c > 4 or len(idx) > 2:  # this "device" holds two prompts at four positions
            raise _oom()
        return real(target, drafter, idx, *a)

    monkeypatch.setattr(scoring, "score_batch", tight)
    squeezed = run_diagnose(cfg)
    assert (4, 64) in seen and all(n <= 2 and c <= 4 for n, c in seen[-2:])
    # smaller batches pad to other widths: the forward's float32 sums differ in the 6th digit
    a, b = plain.model_dump(), squeezed.model_dump()
    for section in ("by_domain", "by_entropy", "by_position", "histograms"):
        # a padding change moves a probability by ~1e-6 absolute whatever its size: small rates need an absolute floor
        assert differences(a[section], b[section], rel=1e-4, abs_=1e-5) == [], section
    da, db = a["depth"], b["depth"]
    # a_j = r_j / r_(j−1) divides r_j's absolute error by a rate near 1e-3, so no tolerance holds: compare the r_j, derive each a_j
    assert differences(da["cumulative"], db["cumulative"], rel=1e-4, abs_=1e-5) == []
    for d in (da, db):
        derived = estimate.conditional([math.nan if r is None else r for r in d["cumulative"]])
        assert d["conditional"] == [None if math.isnan(x) else x for x in derived]  # a result holds no NaN: None
    # the standard errors are sums of squares of those same float32 rates: the same tolerance
    assert differences(da["cumulative_se"], db["cumulative_se"], rel=1e-4, abs_=1e-5) == []
    same = ("cumulative", "conditional", "cumulative_se")
    assert {k: v for k, v in da.items() if k not in same} == {k: v for k, v in db.items() if k not in same}
    assert squeezed.metrics["num_positions"] == plain.metrics["num_positions"]
