"""Every relative link and anchor in README.md and docs/ points at something that exists,
and the README stays a quick start (the write-ups live in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def slugs(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but hyphens and spaces dropped,
    spaces to hyphens, a repeated heading gets -1, -2, …"""
    seen: dict[str, int] = {}
    out = set()
    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links() -> list[str]:
    bad = []
    for page in _pages():
        for target in LINK.findall(_prose(page.read_text())):
            if re.match(r"^[a-z]+:", target):  # http(s), mailto
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                bad.append(f"{where} → no such file")
            elif anchor and dest.suffix == ".md" and anchor not in slugs(dest.read_text()):
                bad.append(f"{where} → no heading #{anchor} in {dest.relative_to(ROOT)}")
    return bad


def test_every_relative_link_and_anchor_resolves() -> None:
    assert broken_links() == []


def test_slugs_follow_github() -> None:
    assert slugs("# A real serving engine: llama.cpp\n## `check`\n## Notes\n## Notes\n") == {"a-real-serving-engine-llamacpp", "check", "notes", "notes-1"}


def test_the_readme_is_a_quick_start() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md is {len(lines)} lines: move write-ups to docs/"
    first = [line for line in lines if line.startswith(("python3 -m venv", ". .venv"))]
    assert first[:2] == [lines[3], lines[7]]  # the install-and-run and the test commands come first
