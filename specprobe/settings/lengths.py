"""Token lengths written as people write them: '1k,2k,4k,8k', '1500', '32k' (k = 1,024)."""

from __future__ import annotations

from specprobe.core.errors import ConfigError

HINT = "use e.g. --context-lengths 1k,2k,4k,8k (k = 1,024 tokens) or plain token counts such as 1500"


def parse_context_lengths(text: str | int | list[int | str], where: str = "--context-lengths") -> list[int]:
    """'1k,2k,4k' -> [1024, 2048, 4096] (sorted, unique); a probe config's list of numbers
    or '4k' strings too; ConfigError on anything else."""
    items = text if isinstance(text, list) else str(text).replace(" ", "").split(",")
    out: set[int] = set()
    for item in items:
        s = str(item).strip().lower()
        if not s:
            continue
        try:
            n = int(float(s[:-1]) * 1024) if s.endswith("k") else int(s)
        except ValueError:
            raise ConfigError(f"{where} {text!r}: {item!r} is not a token length", HINT) from None
        if n < 16:
            raise ConfigError(f"{where} {text!r}: {item!r} is shorter than 16 tokens", HINT)
        out.add(n)
    if not out:
        raise ConfigError(f"{where} {text!r} lists no length", HINT)
    return sorted(out)


def label(n: int) -> str:
    """4096 -> '4k'; 1500 -> '1500'."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)
