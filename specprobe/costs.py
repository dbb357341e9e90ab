"""What a run cost and where it ran: the drafter ÷ target time per decode step, timed on
the device, and the environment (device, dtype, package versions) recorded in a result."""

from __future__ import annotations

import platform
import statistics
import time
from typing import Any


def cost_block(target: Any, drafter: Any, given: float | None) -> dict[str, Any]:
    """The cost ratio the user gave, or one measured on the device when none was."""
    if given is not None:
        return {"cost_ratio": given, "target_step_ms": None, "draft_step_ms": None, "measured": False}
    return measure_cost_ratio(target, drafter)


def measure_cost_ratio(target: Any, drafter: Any, steps: int = 12, repeats: int = 3, prompt_len: int = 32) -> dict[str, Any]:
    """Drafter ÷ target time per decode step at batch 1 with a KV cache, on the device."""
    import torch

    from specprobe.models.loader import cache_kwarg, output_cache

    step_model = drafter.step_model()
    if step_model is None:
        return {"cost_ratio": float("nan"), "target_step_ms": float("nan"), "draft_step_ms": float("nan"), "measured": False}

    def one(model: Any) -> float:
        ids = torch.randint(0, min(1000, target.vocab_size), (1, prompt_len), generator=torch.Generator().manual_seed(0)).to(target.device)
        with torch.inference_mode():
            kw = cache_kwarg(model)
            out = model(input_ids=ids, use_cache=True)
            cache = output_cache(out)
            nxt = out.logits[:, -1:].argmax(-1)
            if target.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                out = model(input_ids=nxt, use_cache=True, **{kw: cache})
                cache = output_cache(out)
                nxt = out.logits[:, -1:].argmax(-1)
            if target.device.startswith("cuda"):
                torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    # interleave so drift on a shared machine hits both sides alike
    t_times, d_times = [], []
    for _ in range(repeats):
        t_times.append(one(target.model))
        d_times.append(one(step_model))
    t_ms, d_ms = statistics.median(t_times) * 1e3, statistics.median(d_times) * 1e3
    return {"cost_ratio": d_ms / t_ms, "target_step_ms": t_ms, "draft_step_ms": d_ms, "measured": True}


def environment(device: str, dtype: Any) -> dict[str, Any]:
    """Device (with the GPU's name), dtype, Python, platform and package versions."""
    from importlib import metadata

    pk: dict[str, str | None] = {}
    for name in ("torch", "transformers", "tokenizers", "safetensors", "gguf", "accelerate", "numpy", "scipy", "pandas", "typer", "rich", "pydantic"):
        try:
            pk[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pk[name] = None
    dev = device
    if device.startswith("cuda"):
        import torch

        dev = f"{device} ({torch.cuda.get_device_name(0)})"
    return {"device": dev, "dtype": str(dtype).replace("torch.", ""), "torch": pk["torch"], "transformers": pk["transformers"], "python": platform.python_version(), "platform": platform.platform(), "packages": pk}
