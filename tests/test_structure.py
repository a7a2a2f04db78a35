"""The layout holds: no import cycle among the project's modules, the layers point one way,
nothing imports a CLI module, and no module grows past what one reader can hold.

Read from the source with ``ast`` (nothing is imported): every ``import`` counts, also those
inside functions and under ``TYPE_CHECKING``, since a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("vigil", "streams", "worldmodel", "probes", "monitor", "dashboards")
# who may import whom: a package imports only those listed (and itself). ``monitor`` sits on
# top; ``dashboards`` (metrics, recall measurement) is below the models; the recall arithmetic
# every package uses is in the base package (``vigil.metrics``).
MAY_IMPORT = {
    "vigil": set(),
    "streams": {"vigil"},
    "dashboards": {"vigil", "streams"},
    "worldmodel": {"vigil", "streams", "dashboards"},
    "probes": {"vigil", "streams", "dashboards", "worldmodel"},
}
MAX_LINES = 600
EXEMPT = {"dashboards/boards.py"}  # the Grafana board definitions: one panel after another
MAX_STREAM_LINES = 350


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


MODULES = _modules()


def _imported(mod: str, path: Path) -> Iterator[str]:
    """The project modules ``mod`` imports (a package's ``__init__`` for ``from pkg import x``
    when ``x`` is not a module)."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = mod.split(".") if is_pkg else mod.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != mod:
                yield name


GRAPH = {m: set(_imported(m, p)) for m, p in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
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
                out.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_imports() -> None:
    # the checks below mean something only if the parser finds real edges
    assert "streams.records" in GRAPH["monitor.stream.screen"]
    assert "monitor.stream.paging" in GRAPH["monitor.stream.review"]
    assert "monitor.scorers" in GRAPH["monitor.policy_config"]


def test_no_import_cycle() -> None:
    cycles = _cycles()
    assert not cycles, "import cycles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{a} -> {sorted(GRAPH[a] & set(c))}" for a in c) + ")"
        for c in cycles
    )


def test_the_layers_point_one_way() -> None:
    wrong = [
        f"{m} imports {d}"
        for m, deps in GRAPH.items()
        for d in deps
        if (top := m.split(".")[0]) in MAY_IMPORT
        and (dt := d.split(".")[0]) != top and dt not in MAY_IMPORT[top]
    ]
    assert not wrong, wrong


def test_nothing_outside_the_cli_imports_a_cli_module() -> None:
    wrong = [f"{m} imports {d}" for m, deps in GRAPH.items() for d in deps
             if (d == "monitor.cli" or d.startswith("monitor.cli."))
             and not (m == "monitor.cli" or m.startswith("monitor.cli."))]
    assert not wrong, wrong


def test_modules_stay_small() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in MODULES.values()}
    big = {f: n for f, n in sizes.items() if n > MAX_LINES and f not in EXEMPT}
    assert not big, f"modules over {MAX_LINES} lines: {big}"
    stream = {f: n for f, n in sizes.items()
              if f.startswith("monitor/stream/") and n >= MAX_STREAM_LINES}
    assert not stream, f"monitor/stream modules of {MAX_STREAM_LINES} lines or more: {stream}"
