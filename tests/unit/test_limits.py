"""``core.limits`` holds the bounds on untrusted input: standard library only, so that the lowest
layer (and ``--help``) can read it, and the one home of each bound (no module keeps a copy)."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import mnistflow
from mnistflow.core import limits


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def test_limits_imports_nothing_beyond_the_standard_library():
    tree = ast.parse(inspect.getsource(limits))
    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert imported <= {"__future__"}, imported


def test_no_module_defines_its_own_copy_of_a_bound():
    names = {k for k in vars(limits) if k.startswith("MAX_")}
    package = Path(mnistflow.__file__).parent
    copies = [f"{p.relative_to(package)}: {t.id}"
              for p in package.rglob("*.py") if p.name != "limits.py"
              for node in _tree(p).body if isinstance(node, (ast.Assign, ast.AnnAssign))
              for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
              if isinstance(t, ast.Name) and t.id in names]
    assert not copies, copies
