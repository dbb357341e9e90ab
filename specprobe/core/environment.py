"""What a result records of the machine it ran on: device (with the GPU's name), dtype,
Python, platform and package versions."""

from __future__ import annotations

import platform
from typing import Any


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
