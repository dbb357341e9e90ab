"""Parsing the YAML and JSON that users write (probe configs, serving configs, rules
tables) without the parsers' sharp edges: aliases that expand to billions of values (a
"billion laughs" document: tiny on disk, and whatever walks it afterwards never ends),
nesting deep enough to overflow the stack, and a key written twice (both parsers keep the
last one without a word).

`load_yaml` and `load_json` raise `UnsafeDocument` (a ValueError with a one-line reason)
for those; plain syntax errors stay the parser's own (yaml.YAMLError,
json.JSONDecodeError), so each caller names its file in its own error.
"""

from __future__ import annotations

import json
from typing import Any

# Values a document may hold once its aliases are expanded: far more than any real
# config or rules table (the default rules are ~2,000), far fewer than a bomb.
MAX_EXPANDED_NODES = 100_000


class UnsafeDocument(ValueError):
    """A document refused before it is used: an alias bomb, a recursive alias, nesting
    too deep for the parser, or a duplicate key. `hint` says what to write instead."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


_FLAT = "a config holds values and short lists, not deep nesting"
_ONCE = "write each key once"
_OUT = "write the values out: an alias may be reused, not fanned out into millions"


def load_yaml(text: str) -> Any:
    """yaml.safe_load, refusing alias bombs (counted on the node graph, never expanded),
    recursive aliases, nesting too deep to parse, and duplicate keys."""
    loader = _loader_class()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    except RecursionError:
        raise UnsafeDocument("nested too deeply to read", _FLAT) from None
    finally:
        loader.dispose()


def load_json(text: str) -> Any:
    """json.loads, refusing duplicate keys and nesting too deep to parse."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise UnsafeDocument(f"duplicate key {key!r}", _ONCE)
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        raise UnsafeDocument("nested too deeply to read", _FLAT) from None


_LOADER: Any = None


def _loader_class() -> Any:
    global _LOADER
    if _LOADER is None:
        import yaml

        class Loader(yaml.SafeLoader):
            def construct_mapping(self, node: Any, deep: bool = False) -> Any:
                self.flatten_mapping(node)  # merge keys (<<) are not duplicates
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=True)
                    try:
                        duplicate = key in seen
                    except TypeError:  # an unhashable key: the base class says so
                        break
                    if duplicate:
                        raise UnsafeDocument(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})", _ONCE)
                    seen.add(key)
                return super().construct_mapping(node, deep=deep)

        _LOADER = Loader
    return _LOADER


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: Any) -> None:
    """Size of the document once every alias is expanded, computed on the node graph
    (each shared node sized once): a bomb is refused in microseconds."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the path from the root: reaching one again is a cycle
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            size = 1 + sum(sizes[id(c)] for c in _children(node))
            sizes[key] = min(size, MAX_EXPANDED_NODES + 1)  # capped: no bigints
            open_nodes.discard(key)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise UnsafeDocument("an alias refers to a value that contains it (a recursive document)", _OUT)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    if sizes[id(root)] > MAX_EXPANDED_NODES:
        raise UnsafeDocument(f"its aliases expand to more than {MAX_EXPANDED_NODES:,} values (a 'billion laughs' document)", _OUT)
