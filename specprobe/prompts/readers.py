"""Reading prompt files: the built-in suite shipped in the wheel, and JSONL files in
Spec-Bench/MT-Bench question format (`question_id`, `category`, `turns`, optional
`reference`) or `{"prompt", "domain"}` lines — the two may be mixed.

Real question files load as they are: every turn is kept, the file's category is kept
beside the folded domain, and a `reference` of any shape (Spec-Bench's RAG lines give
lists of answer-span lists) is kept only when it is text and otherwise just described,
because on-policy runs never read it. Anything that is not a readable JSONL prompt file
raises a one-line `InputError` naming the file (and the line, where there is one).
`-` reads the prompts from standard input.
"""

from __future__ import annotations

import functools
import io
import json
import sys
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from specprobe.core.errors import InputError
from specprobe.prompts.categories import DEFAULT_DOMAIN, DOMAINS, domain_for
from specprobe.prompts.sets import Prompt, PromptSet

# Keys that may carry a dataset response, in priority order.
_REFERENCE_KEYS = ("reference", "response", "answer")

_BUILTIN_RESOURCE = "builtin.jsonl"

# Leading bytes of files people pass by mistake (a compressed or columnar copy).
_MAGIC = (
    (b"\x1f\x8b", "gzip-compressed", "decompress it first (gunzip)"),
    (b"PK\x03\x04", "zip archive", "extract the .jsonl file from the archive"),
    (b"BZh", "bzip2-compressed", "decompress it first (bunzip2)"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first (unxz)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first (unzstd)"),
    (b"PAR1", "Parquet", "convert it to JSON lines, one object per line"),
    (b"ARROW1", "Arrow", "convert it to JSON lines, one object per line"),
)


@functools.lru_cache(maxsize=1)
def builtin_suite() -> PromptSet:
    """The suite shipped inside the package: 10 single-turn prompts in each of DOMAINS."""
    text = resources.files("specprobe.prompts").joinpath(_BUILTIN_RESOURCE).read_text("utf-8")
    prompts = _parse_lines(text, display=f"<builtin {_BUILTIN_RESOURCE}>")
    return PromptSet.from_prompts("builtin", "builtin", prompts)


STDIN = "-"
_STDIN_DISPLAY = "<stdin>"
# stdin can be read once, but a run loads its prompt set more than once (the CLI checks
# it before loading models): the set read from this stdin object is kept.
_stdin_read: tuple[object, PromptSet] | None = None


def load_prompts(path: str | Path) -> PromptSet:
    """Read a JSONL prompts file, a block at a time: a bad line is reported as soon as it
    is reached (a 2 GB file with a bad byte near its start is refused after reading a
    MiB). Raises InputError naming the file and line. "-" reads standard input."""
    if str(path) == STDIN:
        return _load_stdin()
    p = Path(path).expanduser()
    display = str(path)
    if not p.exists():
        raise InputError(
            f"prompts file {display} does not exist",
            "check the path, or leave out --prompts to use the built-in suite",
        )
    if p.is_dir():
        raise InputError(
            f"prompts file {display} is a directory",
            "pass a .jsonl file with one prompt per line (Spec-Bench keeps it in data/spec_bench/question.jsonl)",
        )
    try:
        with p.open("rb") as fh:
            prompts = _parse_records(_read_lines(fh, display), display)
    except OSError as e:
        raise InputError(
            f"prompts file {display} cannot be read: {e.strerror or e}",
            "check the file's permissions",
        ) from e
    return PromptSet.from_prompts(p.name, str(p.resolve()), prompts)


def _load_stdin() -> PromptSet:
    global _stdin_read
    stream = sys.stdin
    if _stdin_read is not None and _stdin_read[0] is stream:
        return _stdin_read[1]
    if stream is None or stream.isatty():
        raise InputError(
            "--prompts - reads the prompts from standard input, which is a terminal",
            "pipe a JSONL file in (specprobe diagnose … --prompts - < questions.jsonl), or pass its path",
        )
    # a text stream without a binary buffer (a test runner's, an embedding program's) is re-encoded
    fh = getattr(stream, "buffer", None) or io.BytesIO(stream.read().encode("utf-8", "surrogateescape"))
    try:
        prompts = _parse_records(_read_lines(fh, _STDIN_DISPLAY), _STDIN_DISPLAY)
    except OSError as e:
        raise InputError(f"standard input cannot be read: {e.strerror or e}", "pass the prompts file's path to --prompts") from e
    # No path to name the set by: its content hash is its identity (as for any file).
    ps = PromptSet.from_prompts("stdin", STDIN, prompts)
    _stdin_read = (stream, ps)
    return ps


# ---------------------------------------------------------------------------- bytes → lines

_BLOCK = 1 << 20
# No prompt line is this long; a file without newlines is not JSON lines.
_MAX_LINE = 64 << 20


def _check_head(head: bytes, display: str) -> None:
    for magic, kind, hint in _MAGIC:
        if head.startswith(magic):
            raise InputError(f"prompts file {display} is a {kind} file, not JSON lines", hint)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputError(f"prompts file {display} is UTF-16 text, not UTF-8", "save the file as UTF-8")


def _read_lines(fh: Any, display: str) -> Iterator[tuple[int, str]]:
    """(line number, text) for every line of a binary file, decoded line by line."""
    block = fh.read(_BLOCK)
    _check_head(block, display)
    offset = 0  # file offset of the first byte of `pending`
    # A BOM is common in files saved by Windows editors; it is not part of line 1's JSON.
    if block.startswith(b"\xef\xbb\xbf"):
        block, offset = block[3:], 3
    pending = b""
    lineno = 0
    while block:
        buf = pending + block
        nul = block.find(b"\x00")
        if nul >= 0:
            # JSON text never holds a raw NUL byte: this is a binary file, not a text file
            # with one bad line.
            at = len(pending) + nul
            line = lineno + buf.count(b"\n", 0, at) + 1
            raise InputError(
                f"{display}:{line}: binary data (NUL byte at offset {offset + at}), not JSON lines",
                "pass a UTF-8 .jsonl text file with one JSON object per line",
            )
        *lines, pending = buf.split(b"\n")
        for raw in lines:
            lineno += 1
            yield lineno, _decode_line(raw, offset, lineno, display)
            offset += len(raw) + 1
        if len(pending) > _MAX_LINE:
            raise InputError(f"{display}:{lineno + 1}: a line longer than {_MAX_LINE >> 20} MiB", "write one JSON object per line")
        block = fh.read(_BLOCK)
    if pending:
        yield lineno + 1, _decode_line(pending, offset, lineno + 1, display)


def _decode_line(raw: bytes, offset: int, lineno: int, display: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{display}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {offset + e.start})",
            "save the file as UTF-8",
        ) from e


def _refuse_json_array(first: str, display: str) -> None:
    # A .json array of question objects is a common near-miss; name it rather than
    # reporting "not a JSON object" on line 1.
    if first.lstrip().startswith("["):
        raise InputError(
            f"prompts file {display} is one JSON array, not JSON lines",
            "write one object per line, e.g. jq -c '.[]' questions.json > questions.jsonl",
        )


# ---------------------------------------------------------------------------- text → prompts


def _parse_lines(text: str, display: str) -> list[Prompt]:
    # Split on "\n" only: str.splitlines() would also split on U+2028 and friends, which
    # JSON allows unescaped inside strings, and would then report the wrong line.
    return _parse_records(enumerate(text.split("\n"), start=1), display)


def _parse_records(lines: Iterable[tuple[int, str]], display: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    first = True
    for lineno, line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            prompt = _parse_record(line, lineno, display)
        except InputError:
            if first:
                _refuse_json_array(line, display)
            raise
        first = False
        if prompt.id in seen:
            raise InputError(
                f"{display}:{lineno}: duplicate id {prompt.id!r} (first on line {seen[prompt.id]})",
                "give every prompt a unique id / question_id",
            )
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise InputError(
            f"{display}: empty prompt set (no prompt lines in the file)",
            'add JSONL lines such as {"prompt": "...", "domain": "chat"}',
        )
    return prompts


def _parse_record(line: str, lineno: int, display: str) -> Prompt:
    where = f"{display}:{lineno}"
    try:
        obj = json.loads(line)
    except RecursionError:
        raise InputError(f"{where}: nested too deeply to read", "each line must be one JSON object") from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"{where}: not valid JSON ({e.msg} at column {e.colno})",
            "each line must be one JSON object",
        ) from e
    if not isinstance(obj, dict):
        raise InputError(
            f"{where}: not a JSON object (got {type(obj).__name__})",
            'each line must be an object such as {"prompt": "...", "domain": "chat"}',
        )

    if "turns" in obj:
        turns = _turns(obj["turns"], where)
        raw_id = obj.get("question_id", obj.get("id"))
    elif "prompt" in obj:
        text = obj["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise InputError(
                f"{where}: `prompt` must be a non-empty string",
                "put the user's message text under `prompt`",
            )
        turns = (text,)
        raw_id = obj.get("id", obj.get("question_id"))
    else:
        raise InputError(
            f"{where}: no prompt text (neither `turns` nor `prompt`)",
            'use {"question_id": 1, "category": "writing", "turns": ["..."]} '
            'or {"prompt": "...", "domain": "chat"}',
        )

    # The file's own label is the category; an explicit `domain` decides the folded
    # domain, otherwise the category is folded.
    category_label = _label(obj.get("category"), where)
    domain_label = _label(obj.get("domain"), where)
    category = category_label or domain_label
    domain_source = domain_label or category_label
    reference, shape = _reference(obj)
    prompt = Prompt(
        id=_prompt_id(raw_id, lineno, where),
        domain=domain_for(domain_source) if domain_source else DEFAULT_DOMAIN,
        category=category or DEFAULT_DOMAIN,
        turns=turns,
        reference=reference,
        reference_shape=shape,
    )
    _refuse_surrogates(prompt, where)
    return prompt


def _refuse_surrogates(prompt: Prompt, where: str) -> None:
    """JSON lets a line escape half of a UTF-16 pair ("\\ud800"); Python keeps it as a
    lone surrogate, which no tokenizer or UTF-8 encoder takes. Refused here, on its line,
    rather than as an encoding traceback when the set is hashed."""
    fields = [("id", prompt.id), ("category", prompt.category), ("domain", prompt.domain), ("reference", prompt.reference or "")]
    fields += [("prompt text" if len(prompt.turns) == 1 else f"turn {i + 1}", t) for i, t in enumerate(prompt.turns)]
    for name, text in fields:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(
                f"{where}: the {name} holds a lone surrogate \\u{ord(text[e.start]):04x} at character {e.start + 1} (half of a UTF-16 pair, not a character)",
                "write the character itself, or both halves of its \\u pair (e.g. \\ud83d\\ude00), or remove the escape",
            ) from None


def _turns(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(t, str) and t.strip() for t in value):
        raise InputError(
            f"{where}: `turns` must be a list of non-empty strings",
            'write the user turns as ["first message", "follow-up"]',
        )
    return tuple(value)


def _label(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(
            f"{where}: category/domain must be a string, got {type(value).__name__}",
            f"use one of: {', '.join(DOMAINS)}",
        )
    return value.strip()


def _reference(obj: dict[str, Any]) -> tuple[str | None, str | None]:
    """(text, None) for the first key holding text — a string, or a list whose first
    element is a string (MT-Bench's one reference per turn: the first answers the first
    turn, which off-policy scoring continues). (None, shape) when references are present
    only in other shapes, e.g. Spec-Bench's lists of answer spans; never an error,
    because only `--reference dataset` reads them."""
    shape: str | None = None
    for key in _REFERENCE_KEYS:
        value = obj.get(key)
        if value is None:
            continue
        first = value[0] if isinstance(value, list) and value else value
        if isinstance(first, str):
            if first.strip():
                return first, None
            continue
        if shape is None and value != []:
            shape = f"`{key}` as {_shape(value)}"
    return None, shape


def _shape(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {_plural(value[0])}"
    return _plural(value, single=True)


def _plural(value: Any, single: bool = False) -> str:
    kind = {list: "list", dict: "object", bool: "boolean", int: "number", float: "number", type(None): "null"}.get(type(value), type(value).__name__)
    if single:
        return ("an " if kind[0] in "aeiou" else "a ") + kind
    return kind + "s"


def _prompt_id(value: Any, lineno: int, where: str) -> str:
    if value is None:
        # Line numbers are unique within a file, so a file without ids still loads.
        return f"line-{lineno}"
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip():
        raise InputError(
            f"{where}: id must be a non-empty string or an integer, got {value!r}",
            "give every prompt a unique id / question_id",
        )
    return str(value).strip()
