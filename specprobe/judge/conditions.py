"""The condition grammar of the rules table: a small tokenizer and recursive-descent
parser (never eval), evaluation over a metrics dict, and the threshold text a finding
shows.

    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | "(" expr ")" | chain
    chain   := operand (cmp operand)+          # 0.3 <= accept_prob_mean < 0.5
    operand := NUMBER | METRIC_NAME | "true" | "false"
    cmp     := "<" | "<=" | ">" | ">=" | "==" | "!="
A condition over a metric that was not measured (missing or nan) is "not evaluated".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from specprobe.judge.catalog import format_value

# ----------------------------------------------------------------------------- grammar
_TOKEN_RE = re.compile(r"\s*(?:(?P<num>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?%?)|(?P<op><=|>=|==|!=|<|>)|(?P<par>[()])|(?P<name>[A-Za-z_][A-Za-z0-9_]*))")
_CMP = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
_PRETTY_OP = {"<": "<", "<=": "≤", ">": ">", ">=": "≥", "==": "=", "!=": "≠"}


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Chain:
    operands: tuple[Num | Var, ...]
    ops: tuple[str, ...]


@dataclass(frozen=True)
class BoolOp:
    op: str  # and | or | not
    args: tuple[Any, ...]


def _tokenize(text: str) -> list[tuple[str, str]]:
    pos, out = 0, []
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"unexpected character {text[pos:].strip()[:1]!r} at position {pos}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise ValueError("condition ends too early")
        self.i += 1
        return tok

    def parse(self) -> Any:
        if not self.toks:
            raise ValueError("empty condition")
        node = self.or_()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return node

    def or_(self) -> Any:
        return self._joined("or", self.and_)

    def and_(self) -> Any:
        return self._joined("and", self.not_)

    def _joined(self, op: str, operand: Callable[[], Any]) -> Any:
        """operand (op operand)*: one operand as itself, more as BoolOp(op, …)."""
        args = [operand()]
        while self.peek() == ("name", op):
            self.take()
            args.append(operand())
        return args[0] if len(args) == 1 else BoolOp(op, tuple(args))

    def not_(self) -> Any:
        tok = self.peek()
        if tok == ("name", "not"):
            self.take()
            return BoolOp("not", (self.not_(),))
        if tok == ("par", "("):
            self.take()
            node = self.or_()
            if self.take() != ("par", ")"):
                raise ValueError("missing ')'")
            return node
        return self.chain()

    def operand(self) -> Num | Var:
        kind, text = self.take()
        if kind == "num":
            return Num(float(text[:-1]) / 100 if text.endswith("%") else float(text))
        if kind == "name" and text in ("true", "false"):
            return Num(1.0 if text == "true" else 0.0)
        if kind == "name" and text not in ("and", "or", "not"):
            return Var(text)
        raise ValueError(f"expected a metric name or a number, got {text!r}")

    def chain(self) -> Chain:
        operands = [self.operand()]
        ops: list[str] = []
        while self.peek() is not None and self.peek()[0] == "op":  # type: ignore[index]
            ops.append(self.take()[1])
            operands.append(self.operand())
        if not ops:
            raise ValueError(f"{operands[0]} is not a comparison (write e.g. 'metric < 0.5')")
        return Chain(tuple(operands), tuple(ops))


def parse_condition(text: str) -> Any:
    try:
        return _Parser(text).parse()
    except RecursionError:  # the parser recurses per "(" and "not"
        raise ValueError("nested too deeply") from None


def condition_metrics(node: Any) -> list[str]:
    if isinstance(node, Var):
        return [node.name]
    if isinstance(node, Chain):
        return [n for o in node.operands for n in condition_metrics(o)]
    if isinstance(node, BoolOp):
        return [n for a in node.args for n in condition_metrics(a)]
    return []


def _value(node: Num | Var, metrics: Mapping[str, Any]) -> float | None:
    if isinstance(node, Num):
        return node.value
    v = metrics.get(node.name)
    if v is None or isinstance(v, (list, dict, str)):
        return None
    v = float(v)
    return None if math.isnan(v) else v


def evaluate(node: Any, metrics: Mapping[str, Any]) -> bool | None:
    """True/False, or None when a metric it needs was not measured."""
    if isinstance(node, Chain):
        vals = [_value(o, metrics) for o in node.operands]
        if any(v is None for v in vals):
            return None
        return all(_CMP[op](vals[i], vals[i + 1]) for i, op in enumerate(node.ops))  # type: ignore[arg-type]
    if isinstance(node, BoolOp):
        results = [evaluate(a, metrics) for a in node.args]
        if node.op == "not":
            return None if results[0] is None else not results[0]
        if node.op == "and":
            if any(r is False for r in results):
                return False
            return None if any(r is None for r in results) else True
        if any(r is True for r in results):
            return True
        return None if any(r is None for r in results) else False
    raise TypeError(node)


def threshold_text(node: Any) -> str:
    """The condition with constants in each metric's unit: 'accept_prob_mean < 5.0%'."""
    if isinstance(node, Chain):
        metric = next((o.name for o in node.operands if isinstance(o, Var)), None)
        parts = []
        for i, o in enumerate(node.operands):
            parts.append(o.name if isinstance(o, Var) else format_value(metric or "", o.value))
            if i < len(node.ops):
                parts.append(_PRETTY_OP[node.ops[i]])
        return " ".join(parts)
    if isinstance(node, BoolOp):
        if node.op == "not":
            return f"not ({threshold_text(node.args[0])})"
        return f" {node.op} ".join(threshold_text(a) for a in node.args)
    return ""
