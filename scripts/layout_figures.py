"""Figures of the package layout: rooms, floors, import arrows, cycles (issue 24).

Reads the Python sources of a package with :mod:`ast` (nothing is imported) and prints:

* **rooms**: modules with code (an ``__init__.py`` that only re-exports counts too);
* **arrows**: distinct module → module imports inside the package, module level and
  inside functions alike;
* **floors**: the length of the longest chain of arrows through the module graph, with
  each import cycle folded into one room;
* **cycles**: groups of modules that import each other (strongly connected components of
  more than one module);
* the same four figures with each sub-package folded into one room (``package_…``);
* **imports inside functions** (with how many of them carry a comment saying why), lines
  naming ``Any``, functions longer than 80 lines.

Usage::

    python scripts/layout_figures.py [--root PATH] [--package sow_redis] [--json OUT]

``--root`` is a checkout (default: this one), so a tree before a change can be measured
with the same script as the tree after it.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """The dotted module name of ``path`` under ``root``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``from … import`` statement reads from."""
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class Graph:
    """Modules of a package and the imports between them."""

    def __init__(self, root: Path, package: str) -> None:
        self.root = root
        self.package = package
        self.files = {
            module_name(p, root): p
            for p in sorted((root / package).rglob("*.py"))
            if "__pycache__" not in p.parts
        }
        self.arrows: dict[str, set[str]] = defaultdict(set)
        self.inner: list[tuple[str, str, bool]] = []
        self.any_lines = 0
        self.long_functions: list[tuple[str, str, int]] = []
        for name, path in self.files.items():
            self._read(name, path)

    def _target(self, name: str) -> str | None:
        while name:
            if name in self.files:
                return name
            name = name.rpartition(".")[0]
        return None

    def _read(self, name: str, path: Path) -> None:
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        is_package = path.name == "__init__.py"
        self.any_lines += sum(1 for line in lines if "Any" in line and _names_any(line))
        function_depth: dict[int, bool] = {}
        for parent in ast.walk(tree):
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (parent.end_lineno or parent.lineno) - parent.lineno + 1
                if length > 80:
                    self.long_functions.append((name, parent.name, length))
                for child in ast.walk(parent):
                    if child is not parent:
                        function_depth[id(child)] = True
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = resolve(name, is_package, node)
                for alias in node.names:
                    full = self._target(f"{base}.{alias.name}") if base else None
                    if full and full != name and full.startswith(base + "."):
                        targets.append(full)
                    else:
                        found = self._target(base)
                        if found:
                            targets.append(found)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    found = self._target(alias.name)
                    if found:
                        targets.append(found)
            else:
                continue
            inside = function_depth.get(id(node), False)
            line = lines[node.lineno - 1]
            prev = lines[node.lineno - 2] if node.lineno > 1 else ""
            for target in targets:
                if target == name or not target.startswith(self.package):
                    continue
                self.arrows[name].add(target)
                if inside:
                    self.inner.append((name, target, "#" in line or prev.strip().startswith("#")))

    def components(self) -> list[list[str]]:
        """Strongly connected components (Tarjan), each a list of module names."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        out: list[list[str]] = []
        counter = [0]
        sys.setrecursionlimit(10000)

        def visit(v: str) -> None:
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on_stack.add(v)
            for w in sorted(self.arrows.get(v, ())):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                out.append(sorted(group))

        for v in self.files:
            if v not in index:
                visit(v)
        return out

    def floors(self, groups: list[list[str]]) -> int:
        """Longest chain of arrows through the graph with each cycle folded."""
        room = {m: i for i, g in enumerate(groups) for m in g}
        edges: dict[int, set[int]] = defaultdict(set)
        for a, targets in self.arrows.items():
            for b in targets:
                if room[a] != room[b]:
                    edges[room[a]].add(room[b])
        depth: dict[int, int] = {}
        # Tarjan emits components in reverse topological order: dependencies first.
        for i in range(len(groups)):
            depth[i] = 1 + max((depth[j] for j in edges[i]), default=0)
        return max(depth.values(), default=0)


def _names_any(line: str) -> bool:
    import re

    return re.search(r"\bAny\b", line) is not None and not line.lstrip().startswith("#")


def by_package(graph: Graph) -> Graph:
    """The same graph with each sub-package folded into one room (``sow_redis.apply``, …);
    top-level modules stay rooms of their own."""
    def room(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:2])

    folded = object.__new__(Graph)
    folded.root, folded.package = graph.root, graph.package
    folded.files = {room(m): p for m, p in graph.files.items()}
    folded.arrows = defaultdict(set)
    for a, targets in graph.arrows.items():
        for b in targets:
            if room(a) != room(b):
                folded.arrows[room(a)].add(room(b))
    folded.inner, folded.any_lines, folded.long_functions = [], 0, []
    return folded


def figures(root: Path, package: str) -> dict[str, object]:
    """All figures of ``package`` under ``root`` as one JSON-ready dict."""
    graph = Graph(root, package)
    folded = by_package(graph)
    folded_groups = folded.components()
    groups = graph.components()
    cycles = [g for g in groups if len(g) > 1]
    return {
        "rooms": len(graph.files),
        "arrows": sum(len(t) for t in graph.arrows.values()),
        "floors": graph.floors(groups),
        "cycles": cycles,
        "package_rooms": len(folded.files),
        "package_arrows": sum(len(t) for t in folded.arrows.values()),
        "package_floors": folded.floors(folded_groups),
        "package_cycles": [g for g in folded_groups if len(g) > 1],
        "imports_inside_functions": len(graph.inner),
        "imports_inside_functions_with_comment": sum(1 for *_, c in graph.inner if c),
        "any_lines": graph.any_lines,
        "functions_over_80_lines": sorted(graph.long_functions, key=lambda t: -t[2]),
    }


def main() -> None:
    """Print the figures as a table (and write them as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--package", default="sow_redis")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = figures(args.root, args.package)
    for key, value in result.items():
        if isinstance(value, list):
            print(f"{key:40} {len(value)}")
            for item in value:
                print(f"    {item}")
        else:
            print(f"{key:40} {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
