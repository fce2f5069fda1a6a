"""The house rule, checked: the layer contracts in pyproject.toml (import-linter) and the top level.

Machinery imports downward only (core <- runtime <- data <- kernels <- models <- artifacts), the
verbs sit on top and do not import each other, and no modules import each other in a cycle.
"""
from __future__ import annotations

from pathlib import Path

import mnistflow

PKG = Path(mnistflow.__file__).parent
REPO = PKG.parents[1]

MACHINERY = {"core", "runtime", "data", "kernels", "models", "artifacts"}
VERBS = {"training", "inference", "exporting", "reporting", "summary", "doctor", "server"}


def test_the_import_contracts_hold(capsys):
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True)
    assert code == 0, capsys.readouterr().out


def test_the_top_level_is_the_cli_one_entry_per_verb_and_the_machinery():
    top = {p.stem for p in PKG.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert top == {"__init__", "__main__", "cli"} | VERBS | MACHINERY


def test_a_broken_layer_is_caught(tmp_path, capsys):
    """The contract is not vacuous: a config that forbids an import the code makes fails."""
    from importlinter.cli import lint_imports

    cfg = tmp_path / "contract.toml"
    cfg.write_text('[tool.importlinter]\nroot_package = "mnistflow"\n\n[[tool.importlinter.contracts]]\n'
                   'name = "inverted"\ntype = "layers"\nlayers = ["mnistflow.core", "mnistflow.models"]\n')
    assert lint_imports(config_filename=str(cfg), no_cache=True) == 1
