"""Launch scripts and args files read as the shell and the engines' argument parsers
read them: a script's simple commands word by word (quotes, line continuations,
comments, `$VAR` and `${VAR:-default}`, redirections), and a command's flags in
`--flag value` and `--flag=value` forms. Engine-free: which program a command starts and
what its flags mean is each engine's serving-config reader's business
(`specprobe.engines.<engine>.serving`)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class Command:
    line: int
    words: list[str]


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def commands(text: str, variables: Mapping[str, str]) -> Iterator[Command]:
    """A shell script's simple commands, word by word, as bash splits them: quotes, `\\`
    line continuations, comments, `;` `&` `|` and newlines between commands, redirections
    dropped, and $NAME / ${NAME} / ${NAME:-default} expanded from `variables` — read as
    each command is reached, so an assignment counts from the next command on. What cannot
    be known here ($(…), an unset variable) is kept as written."""
    i, n, line = 0, len(text), 1
    words: list[str] = []
    cur: list[str] | None = None
    start = 1

    def flush_word() -> None:
        nonlocal cur
        if cur is not None:
            words.append("".join(cur))
            cur = None

    def expand(j: int) -> tuple[str, int]:
        """The text of a $ at text[j] and the index after it."""
        if j + 1 < n and text[j + 1] == "{":
            end = text.find("}", j + 2)
            if end < 0:
                return text[j:], n
            body = text[j + 2 : end]
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)(?::?[-=](.*))?$", body, re.S)
            if m and m.group(1) in variables and (variables[m.group(1)] or ":" not in body[len(m.group(1)) : len(m.group(1)) + 1]):
                return variables[m.group(1)], end + 1
            if m and m.group(2) is not None:
                return m.group(2), end + 1
            return text[j : end + 1], end + 1
        if j + 1 < n and text[j + 1] == "(":
            depth, k = 0, j + 1
            while k < n:
                depth += {"(": 1, ")": -1}.get(text[k], 0)
                if depth == 0:
                    break
                k += 1
            return text[j : k + 1], k + 1
        m = NAME.match(text, j + 1)
        if m:
            return variables.get(m.group(0), text[j : m.end()]), m.end()
        return "$", j + 1

    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] == "\n":
            i, line = i + 2, line + 1
            continue
        if c == "\n" or c in ";&|()":
            flush_word()
            if words:
                yield Command(start, words)
                words = []
            line += c == "\n"
            i += 1
            continue
        if c in " \t\r":
            flush_word()
            i += 1
            continue
        if c in "<>":
            if cur is not None and "".join(cur).isdigit():  # 2>file: the descriptor is no word
                cur = None
            flush_word()
            i += 1
            while i < n and text[i] in "<>&":
                i += 1
            while i < n and text[i].isdigit():  # 2>&1
                i += 1
            while i < n and text[i] in " \t":
                i += 1
            while i < n and text[i] not in " \t\n;&|":  # the redirection's target
                i += 1
            continue
        if c == "#" and cur is None:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if cur is None:
            cur, start = [], (start if words else line)
        if c == "\\":
            cur.append(text[i + 1 : i + 2])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            cur.append(text[i + 1 : end])
            line += text.count("\n", i, end)
            i = end + 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '"\\$`\n':
                    if text[i + 1] != "\n":
                        cur.append(text[i + 1])
                    line += text[i + 1] == "\n"
                    i += 2
                elif text[i] == "$":
                    s, i = expand(i)
                    cur.append(s)
                else:
                    line += text[i] == "\n"
                    cur.append(text[i])
                    i += 1
            i += 1
        elif c == "$":
            s, i = expand(i)
            cur.append(s)
        else:
            cur.append(c)
            i += 1
    flush_word()
    if words:
        yield Command(start, words)


_NEGATIVE = re.compile(r"^-\.?\d")


def is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not _NEGATIVE.match(word)


def split_flags(args: list[str], value_flags: frozenset[str], bool_flags: frozenset[str], dashes: bool = True) -> tuple[list[tuple[str, Any, str]], list[str]]:
    """(flag, value, as written) for each option of a command line, and its positional
    words. `--flag=value` and `--flag value`; a flag the engine takes without a value
    (`bool_flags`, `--enable-*`, `--disable-*`, `--no-*`) is True; an unknown flag takes
    the next word unless that is a flag. `dashes`: `--a_b` is `--a-b` (all three engines)."""
    out: list[tuple[str, Any, str]] = []
    positional: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if not is_flag(a):
            positional.append(a)
            i += 1
            continue
        written, eq, value = a.partition("=")
        name = written
        if dashes and name.startswith("--"):
            head, dot, tail = name.partition(".")  # vLLM's dotted JSON keys keep their spelling
            name = head.replace("_", "-") + dot + tail
        if eq:
            out.append((name, value, written))
            i += 1
        elif name in value_flags:
            out.append((name, args[i + 1] if i + 1 < len(args) else "", written))
            i += 2
        elif name in bool_flags or (name.startswith(("--enable-", "--disable-", "--no-")) and "." not in name):
            out.append((name, True, written))
            i += 1
        elif i + 1 < len(args) and not is_flag(args[i + 1]):
            out.append((name, args[i + 1], written))
            i += 2
        else:
            out.append((name, True, written))
            i += 1
    return out, positional
