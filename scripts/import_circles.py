#!/usr/bin/env python3
"""Lists the import circles among a package's modules and exits 1 if there is any.

A circle is a strongly connected component (more than one module) of the graph "module A imports module B",
where every import counts: at module level, inside functions, under ``if TYPE_CHECKING:`` (a type-only import
couples too). ``from pkg import name`` counts as importing ``pkg`` and, when ``pkg.name`` is a module,
``pkg.name``. A module importing one of its own ancestor packages is not counted (the package re-exports it).

Usage: scripts/import_circles.py [PACKAGE_DIR]   (default: rockstate)
"""
from __future__ import annotations

import ast
import os
import sys


def modules(root: str) -> dict[str, str]:
    """Module name -> file path, for every .py file under root (root's parent is the import root)."""
    base = os.path.dirname(os.path.abspath(root))
    found = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                mod = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                if mod.endswith(".__init__"):
                    mod = mod[: -len(".__init__")]
                found[mod] = path
    return found


def imports_of(mod: str, path: str, known: set[str]) -> set[str]:
    pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    out = set()
    for node in ast.walk(tree):  # every import, at any depth: functions, methods, TYPE_CHECKING blocks
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - node.level + 1]
                target = ".".join(parts + ([target] if target else []))
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        for n in names:
            if n in known and n != mod and not mod.startswith(n + "."):
                out.add(n)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def main(argv: list[str]) -> int:
    root = argv[1] if len(argv) > 1 else "rockstate"
    mods = modules(root)
    known = set(mods)
    graph = {m: imports_of(m, p, known) for m, p in mods.items()}
    found = circles(graph)
    for comp in found:
        members = set(comp)
        print(f"import circle ({len(comp)} modules):")
        for m in comp:
            inside = sorted(graph[m] & members)
            print(f"    {m} -> {', '.join(inside)}")
    if found:
        print(f"{len(found)} import circle(s) in {root}")
        return 1
    print(f"no import circle in {root} ({len(mods)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
