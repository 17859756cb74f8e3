"""Print the package's layer diagram as Graphviz DOT: one node per top-level module of
reasonrl (packages collapsed), one edge per import between them, ranked by the layers of
the import-linter contract in pyproject.toml. `make layers` renders it to docs/layers.svg."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def layers() -> list[list[str]]:
    """The layers contract's layers, top first, each a list of sibling module names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]


def top_level_edges(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    """(importer, imported) between distinct top-level modules of the package."""
    edges = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = module.split(".")[1:2], imported.split(".")[1:2]
            if a and b and a != b:
                edges.add((a[0], b[0]))
    return edges


def dot() -> str:
    graph = grimp.build_graph("reasonrl")
    lines = [
        "digraph layers {",
        '  graph [rankdir=TB, nodesep=0.3, ranksep=0.5, fontname="Helvetica"];',
        '  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica"];',
        '  edge [color="#8a94a6", arrowsize=0.6];',
    ]
    for layer in layers():
        lines.append("  { rank=same; " + " ".join(f'"{name}";' for name in layer) + " }")
    lines += [f'  "{a}" -> "{b}";' for a, b in sorted(top_level_edges(graph))]
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(dot(), end="")
