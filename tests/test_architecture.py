"""The package's layering: the import-linter contracts of pyproject.toml hold, and no module
imports itself back through any chain (docs/architecture.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def test_import_contracts_are_kept():
    result = subprocess.run(
        [str(VENV_BIN / "lint-imports"), "--no-cache"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_no_module_takes_part_in_an_import_cycle():
    # as lint-imports counts them (pyproject.toml): a type hint's import is no dependency
    graph = grimp.build_graph("reasonrl", exclude_type_checking_imports=True)
    cycles = [
        (importer, imported)
        for importer in sorted(graph.modules)
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    ]
    assert cycles == []


def test_every_rules_file_with_a_cli_call_has_its_stage_module():
    rules = {
        path.stem
        for path in (REPO / "workflow/rules").glob("*.smk")
        if "reasonrl " in path.read_text()
    }
    stages = {path.stem for path in (REPO / "workflow/reasonrl/stages").glob("[!_]*.py")}
    assert rules <= stages, rules - stages
