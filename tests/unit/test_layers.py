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


def lint(config: Path) -> bool:
    """import-linter's check, in this process. It configures logging with ``dictConfig``, which
    disables every logger that exists (mnistflow's too): their state is put back after it."""
    import logging

    from importlinter.cli import lint_imports

    loggers = [lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    enabled = [lg for lg in loggers if not lg.disabled]
    try:
        return lint_imports(config_filename=str(config), no_cache=True) == 0
    finally:
        for lg in enabled:
            lg.disabled = False


def test_the_import_contracts_hold(capsys):
    assert lint(REPO / "pyproject.toml"), capsys.readouterr().out


def test_the_top_level_is_the_cli_one_entry_per_verb_and_the_machinery():
    top = {p.stem for p in PKG.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert top == {"__init__", "__main__", "cli"} | VERBS | MACHINERY


def test_a_broken_layer_is_caught(tmp_path):
    """The contract is not vacuous: a config that forbids an import the code makes fails."""
    cfg = tmp_path / "contract.toml"
    cfg.write_text('[tool.importlinter]\nroot_package = "mnistflow"\n\n[[tool.importlinter.contracts]]\n'
                   'name = "inverted"\ntype = "layers"\nlayers = ["mnistflow.core", "mnistflow.models"]\n')
    assert not lint(cfg)


def test_no_dataset_constants_in_the_code():
    """Normalization, channels and size come from the records: MNIST's mean/std (0..1 or
    0..255 units) appear nowhere in the package (the issue's check, as a test)."""
    import re
    from pathlib import Path

    import mnistflow

    pattern = re.compile(r"0\.1307|0\.3081|33\.318|78\.567|\b33\.3[0-9]\b|\b78\.5[0-9]\b")
    hits = [f"{p}:{i}" for p in Path(mnistflow.__file__).parent.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits
