"""The import plan of sparkdist, read from the source with ast (nothing is imported): imports
go down the layers of :data:`LAYERS`, never up; no module imports itself round a circle; no
module is longer than :data:`MAX_LINES`.

Every import counts, wherever it is written: at module level, inside a function (it runs when
the function does) and under ``if TYPE_CHECKING:`` (it runs for the type checker: a type taken
from a layer above is a dependency on it, and a circle of types is a circle of modules).
``from a import b`` counts as an import of the module ``a.b`` where that is a module, else of
``a``. Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``: those edges count
for circles (not for layers; a module's own packages are left out, Python has started them
before it). Strings given to ``importlib`` are not imports.

Run it as a script (``python tests/unit/test_import_layers.py``) for the figures: circles,
upward imports, modules over the limit.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkdist"
MAX_LINES = 600

#: The layers, top to bottom: a module may import modules of its own layer and of the layers
#: below it. A module belongs to the layer of the longest prefix (a module or package name)
#: that names it; a module no prefix names fails the test (place it here). The order, why:
#: - config reads the estimator table of models (``ESTIMATORS``); tracking reloads saved
#:   stages (persist) and evaluates them (evaluation); both serve workflows and the cli.
#: - torchtrain sits above launch: ``torchtrain.launch`` starts barrier stages through
#:   ``launch.barrier``, and the ranks' code takes launch's ``WorkerContext``.
#: - persist is below models and features, which mix in its ``ParamsPersistence``; it finds
#:   their classes by module name, never by importing them (its allowlist is a rule on names).
#: - launch (barrier stages, elastic re-planning, preflight) serves models and torchtrain;
#:   nothing below it starts a stage. store is below persist (the commit protocol writes
#:   through it) and below torchtrain (checkpoints); ``_fs`` holds its per-store primitives.
#: - the ground imports nothing above it: ``_params`` (Param helpers every stage mixes in),
#:   ``_internals`` (every use of pyspark's and xgboost's private API; no sparkdist import),
#:   ``failpoints`` and ``hooks`` (fault injection and benchmark hooks, read by models and
#:   torchtrain; they import nothing above them),
#:   ``session``, ``columns``, and ``launch.daemon``: Spark's Python daemon, named in a Spark
#:   conf by ``session.preload_conf``; it imports no sparkdist module (it preloads modules by
#:   name), so it belongs with the session that names it rather than with launch.
#: - tuning (Tuner) fits whatever estimator it is given: it imports no model module today
#:   (launch.preflight for the task slots, features.split, evaluation, persist for its nested
#:   best model), but sits above models so that it may; nothing but entry points imports it.
#: - datasets (sample data, ``session.get_spark`` for a DataFrame) and plots (figures of
#:   columns) are data helpers for workflows and notebooks.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("entry points", ("sparkdist", "sparkdist.cli", "sparkdist.notebook")),
    ("workflows", ("sparkdist.workflows",)),
    ("configuration and tracking", ("sparkdist.config", "sparkdist.tracking")),
    ("tuning", ("sparkdist.tuning",)),
    ("models", ("sparkdist.models",)),
    ("torch training", ("sparkdist.torchtrain",)),
    ("launch", ("sparkdist.launch",)),
    ("features, persistence and data",
     ("sparkdist.features", "sparkdist.persist", "sparkdist.evaluation", "sparkdist.datasets",
      "sparkdist.plots")),
    ("storage", ("sparkdist.store", "sparkdist._fs")),
    ("ground", ("sparkdist._params", "sparkdist._internals", "sparkdist.failpoints",
                "sparkdist.hooks", "sparkdist.session", "sparkdist.columns",
                "sparkdist.launch.daemon")),
    ("exceptions", ("sparkdist.exceptions",)),
)


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a relative ``from`` import's base."""
    if not level:
        return name or ""
    base = module.split(".")
    base = base[:len(base) - level + (1 if is_package else 0)]
    return ".".join(base + ([name] if name else []))


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The sparkdist modules ``module`` (at ``path``) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path.name == "__init__.py", node.level, node.module)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return {name for name in found if name in modules and name != module}


@functools.cache
def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(direct imports, direct imports plus the packages they start) of every module."""
    files = module_files()
    direct = {name: imports_of(name, path, set(files)) for name, path in files.items()}
    running: dict[str, set[str]] = {}
    for name, targets in direct.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        parents = {".".join(target.split(".")[:i]) for target in targets
                   for i in range(2, target.count(".") + 1)}
        running[name] = targets | {p for p in parents - own if p in files and p != name}
    return direct, running


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix naming ``module`` (-1: none)."""
    best, length = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            named = module == prefix or (prefix != "sparkdist"
                                         and module.startswith(prefix + "."))
            if named and len(prefix) > length:
                best, length = index, len(prefix)
    return best


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def upward(direct: dict[str, set[str]]) -> list[str]:
    """Each import of a module in a layer above the importer's, as ``a -> b (layer)``."""
    return [f"{name} -> {target} ({LAYERS[layer_of(target)][0]} is above "
            f"{LAYERS[layer_of(name)][0]})"
            for name, targets in sorted(direct.items()) for target in sorted(targets)
            if 0 <= layer_of(target) < layer_of(name)]  # unplaced: the test above


def oversized() -> list[str]:
    return [f"{path.relative_to(ROOT)}: {lines} lines"
            for path in module_files().values()
            if (lines := len(path.read_text().splitlines())) > MAX_LINES]


# ------------------------------------------------------------------------------- the tests
def test_every_module_has_a_layer_and_every_prefix_a_module():
    modules = module_files()
    unplaced = [name for name in modules if layer_of(name) < 0]
    assert not unplaced, f"add these modules to LAYERS in {__file__}: {unplaced}"
    stale = [prefix for _, prefixes in LAYERS for prefix in prefixes if prefix not in modules]
    assert not stale, f"LAYERS names modules that are gone: {stale}"


def test_no_import_runs_up_the_layers():
    found = upward(graph()[0])
    assert not found, "imports that run up the layers:\n" + "\n".join(found)


def test_no_import_circles():
    found = circles(graph()[1])
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_over_the_line_limit():
    found = oversized()
    assert not found, f"modules over {MAX_LINES} lines:\n" + "\n".join(found)


def test_the_checks_see_what_they_must(tmp_path):
    """The graph reader on a known shape: a function-level import, a ``from`` import of a
    submodule, a relative import, and a circle through them."""
    modules = {"sparkdist.a", "sparkdist.b", "sparkdist.b.c"}
    source = {"sparkdist.a": "def f():\n    from sparkdist.b import c\n",
              "sparkdist.b.c": "from .. import a\nimport sparkdist.b\n"}
    edges = {}
    for name, text in source.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        edges[name] = imports_of(name, path, modules)
    assert edges == {"sparkdist.a": {"sparkdist.b.c"},
                     "sparkdist.b.c": {"sparkdist.a", "sparkdist.b"}}
    assert circles(edges) == [["sparkdist.a", "sparkdist.b.c"]]
    assert layer_of("sparkdist.launch.daemon") > layer_of("sparkdist.launch.barrier")
    assert layer_of("sparkdist.models.torch") == layer_of("sparkdist.models")


if __name__ == "__main__":
    direct, running = graph()
    for title, rows in (("circles", [" <-> ".join(c) for c in circles(running)]),
                        ("upward imports", upward(direct)),
                        (f"modules over {MAX_LINES} lines", oversized())):
        print(f"{title}: {len(rows)}")
        for row in rows:
            print("  " + row)
