"""The settings of a run that loads models (check, diagnose, simulate): one options
object per command, built by the CLI from flags and a probe config, read by the pipeline."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specprobe.alignment import SamplingFlags

# Positions per metrics chunk: small enough that the four [chunk, V] float32 scratch
# buffers stay warm in cache (measured best at 32–64 on a 2-core CPU with V = 49,152).
DEFAULT_CHUNK_POSITIONS = 64


@dataclass
class DiagnoseConfig:
    target: str
    drafter: str
    prompts: str = "builtin"
    domains: list[str] | None = None
    max_prompts: int | None = None
    max_new_tokens: int = 64
    reference: str = "on-policy"  # or "dataset"
    sampling: SamplingFlags = field(default_factory=SamplingFlags)
    seed: int = 0
    batch_size: int = 8
    k_max: int = 8
    verify_factor: float = 1.0
    cost_ratio: float | None = None  # None: measure on the device
    device: str = "auto"
    dtype: str = "auto"
    rules: list[str] = field(default_factory=list)
    fail_on: str = "error"
    force: bool = False
    use_cache: bool = True
    chunk_positions: int = DEFAULT_CHUNK_POSITIONS
    keep_positions: bool = True

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("sampling"))
        return d


@dataclass
class SimulateConfig:
    """`simulate` = `diagnose`'s settings (the estimate on the same prompts) + the loop's."""

    diagnose: Any  # DiagnoseConfig
    ks: list[int] = field(default_factory=lambda: [1, 2, 4])
    adaptive_threshold: float | None = None
    baseline: bool = True  # also time plain target decoding (the speedup's denominator)

    def to_dict(self) -> dict[str, Any]:
        d = self.diagnose.to_dict()
        d.update({"k": list(self.ks), "adaptive_threshold": self.adaptive_threshold})
        return d


def parse_ks(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique); ConfigError on anything else."""
    from specprobe.errors import ConfigError

    try:
        ks = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise ConfigError(f"--k {text!r} is not a comma-separated list of integers", "use e.g. --k 1,2,4") from None
    if not ks or ks[0] < 1 or ks[-1] > 32:
        raise ConfigError(f"--k {text!r} must list draft lengths between 1 and 32", "use e.g. --k 1,2,4")
    return ks


def validate(cfg: SimulateConfig) -> None:
    from specprobe.errors import ConfigError

    if not cfg.ks or min(cfg.ks) < 1 or max(cfg.ks) > 32:
        raise ConfigError(f"--k {cfg.ks} must list draft lengths between 1 and 32", "use e.g. --k 1,2,4")
    t = cfg.adaptive_threshold
    if t is not None and not 0.0 <= t <= 1.0:
        raise ConfigError(f"--adaptive-threshold {t} is outside [0, 1]", "it is a drafter confidence max q; use e.g. 0.4")
