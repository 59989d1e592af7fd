"""How settings travel: scripts share library modules and never import each other or write their globals.

.venv/bin/python -m pytest tests/test_structure.py -q
"""

import ast

import pytest
from conftest import REPO

MODULES = sorted(p for p in REPO.glob("*.py"))
SCRIPTS = {"grpotrainer", "evaluate", "export"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_module_imports_a_script_or_writes_globals(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        assert not set(names) & (SCRIPTS - {path.stem}), f"{path.name}:{node.lineno} imports a script"
        assert not isinstance(node, ast.Global), f"{path.name}:{node.lineno} uses `global`"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            target = node.args[0]
            assert not (isinstance(target, ast.Name) and target.id in SCRIPTS), f"{path.name}:{node.lineno}"


def test_the_training_script_reads_in_one_sitting():
    lines = (REPO / "grpotrainer.py").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    tree = ast.parse("\n".join(lines))
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert main.end_lineno - main.lineno + 1 <= 40


def test_the_readme_fits_a_sitting():
    assert len((REPO / "README.md").read_bytes()) <= 16_000
