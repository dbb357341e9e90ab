"""The package's import graph: no cycles, and every import points down the layering that
docs/architecture.md draws. Read from the source with `ast` (nothing is imported), so
an import inside a function, or under `if TYPE_CHECKING:` for annotations only, counts
as much as one at the top of a module."""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

from specprobe.engines import NAMES as ENGINE_NAMES

ROOT = Path(__file__).resolve().parent.parent / "specprobe"

# Lowest first; a module may import from its own floor or any floor below it. Each entry
# is a package or module prefix (the longest prefix that matches a module wins); a `*`
# stands for one name, so "specprobe.engines.*.serving" is every engine's serving module.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("specprobe.core", "specprobe"),  # errors, files, progress, interrupts; the version
    ("specprobe.engines",),  # what each serving engine does: one package per engine
    ("specprobe.estimates",),  # τ(K), speedup, round costs: pure numbers
    ("specprobe.metrics",),  # per-position maths on tensors, mergeable accumulators
    ("specprobe.judge.catalog", "specprobe.judge.conditions"),  # the metrics' names and the rule grammar
    ("specprobe.result",),  # the typed result every report renders
    ("specprobe.judge",),  # the rules engine over the result's numbers; the regression gate
    ("specprobe.settings.model", "specprobe.settings.lengths", "specprobe.settings.values", "specprobe.settings.config", "specprobe.settings.shell", "specprobe.settings.served"),  # the settings table, its files and what every serving-config reader shares
    ("specprobe.engines.*.serving",),  # each engine's serving-config reader
    ("specprobe.settings",),  # the settings model, probe and serving configs
    ("specprobe.prompts",),
    ("specprobe.drafters",),  # the Drafter interface; the drafters that need no model
    ("specprobe.models.anatomy",),  # where a model keeps its layers: walked by precision and models alike
    ("specprobe.precision",),  # the weights and KV cache as served
    ("specprobe.models",),  # the only code that reads weights
    ("specprobe.probe",),  # the diagnose pipeline: alignment → references → scoring → assembly
    ("specprobe.simulate",),  # the real draft → verify loop
    ("specprobe.report",),  # renders saved results; never computes
    ("specprobe.engines.*.export", "specprobe.engines.export"),  # each engine's serving-config writer (reads results)
    ("specprobe.export",),  # saved results → engine configs and retraining data
    ("specprobe.monitor.windows", "specprobe.monitor.base", "specprobe.monitor.records"),  # monitor's series, store and log records
    ("specprobe.engines.*.monitor",),  # each engine's metric names, log parsers and rule names
    ("specprobe.monitor",),
    ("specprobe.cli", "specprobe.__main__"),
)
# Imports that point up on purpose, each with its reason.
ALLOWED_UP = {
    ("specprobe.judge.compare", "specprobe.report.fmt"): "the gate's messages format numbers as every report does",
    # `diagnose --against` reads a live answer's own counters with the reader `monitor
    # --requests` uses on a saved one: one reader of vLLM's shapes, not two (imported when called)
    ("specprobe.engines.vllm.client", "specprobe.engines.vllm.monitor"): "a live answer's counters read as a saved one's",
    ("specprobe.engines.vllm.client", "specprobe.monitor.records"): "the reader's one-line error (MalformedLine)",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _imports(mods: dict[str, Path], packages: bool = False) -> dict[str, set[str]]:
    """Module → the modules it imports; with `packages`, also the packages whose
    __init__ an import runs first (importing a.b.c runs a and a.b), as cycles see them."""
    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("specprobe"):
                    target = resolve(name)
                    # importing a.b.c runs the packages' __init__ (a, a.b) first: edges too
                    parts = target.split(".")
                    for k in range(len(parts) if not packages else 2, len(parts) + 1):
                        node = ".".join(parts[:k])
                        if node in mods and node != m and not m.startswith(node + "."):
                            edges[m].add(node)
    return edges


def _floor(module: str) -> int:
    best, floor = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (fnmatchcase(module, prefix) or fnmatchcase(module, prefix + ".*")) and len(prefix) > best:
                best, floor = len(prefix), i
    assert floor >= 0, f"{module} is on no floor of LAYERS"
    return floor


def test_no_import_cycles() -> None:
    edges = _imports(_modules(), packages=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_point_down_the_layering() -> None:
    edges = _imports(_modules())
    up = sorted((a, b) for a, bs in edges.items() for b in bs if _floor(b) > _floor(a) and (a, b) not in ALLOWED_UP)
    assert not up, "imports against the layering (see docs/architecture.md): " + ", ".join(f"{a} → {b}" for a, b in up)


def test_the_top_level_holds_packages_only() -> None:
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules at the top of specprobe/ (put each in the package that owns it): {loose}"


# Modules outside engines/ that still hold an engine's own knowledge, each with where it goes.
ENGINE_KNOWLEDGE_PENDING: dict[str, str] = {
}
# Not an engine: the checkpoint layout vLLM's Medusa model reads is called "vllm" by
# its files, as the speculators format is called "speculators".
NOT_AN_ENGINE = {("specprobe.models.heads.medusa", "vllm")}


def _names_an_engine(node: ast.AST) -> str | None:
    """The engine name a comparison or a table key spells out, if any."""
    def spelled(n: ast.AST) -> str | None:
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in ENGINE_NAMES:
            return n.value
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            return next((x for x in map(spelled, n.elts) if x), None)
        return None

    if isinstance(node, ast.Compare):
        return next((x for x in map(spelled, [node.left, *node.comparators]) if x), None)
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:  # engine = "vllm"
        return spelled(node.value)
    if isinstance(node, ast.Dict):  # a table keyed by engine (one such key may be a package's name)
        keys = [x for x in map(spelled, [k for k in node.keys if k is not None]) if x]
        return keys[0] if len(keys) > 1 else None
    return None


def test_only_the_engines_compare_engine_names() -> None:
    """Every layer asks the engine object (`specprobe.engines.get(name)`); no module
    outside engines/ compares an engine's name, keys a table by it or assigns it."""
    found = []
    for m, p in _modules().items():
        if m.startswith("specprobe.engines") or m in ENGINE_KNOWLEDGE_PENDING:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            name = _names_an_engine(node)
            if name and (m, name) not in NOT_AN_ENGINE:
                found.append(f"{m}:{node.lineno} names {name!r}")  # type: ignore[attr-defined]
    assert not found, "ask the engine object instead: " + "; ".join(found)
