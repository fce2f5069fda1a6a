"""Run at the start of every Python process whose PYTHONPATH holds this folder (set by
``helpers.inject.env``): injects the faults ``$MNISTFLOW_TEST_FAULTS`` names, then runs the
``sitecustomize`` this one shadows, if any. A fault that cannot be installed ends the process
(exit 3): a test must never run without the fault it asked for."""
import importlib.util
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


try:
    _load("_mnistflow_test_inject", _HERE.parent / "inject.py")
    sys.modules["_mnistflow_test_inject"].install_from_env()
except Exception as e:  # noqa: BLE001 -- site would print one line and go on without the fault
    sys.stderr.write(f"helpers/inject_site: cannot inject {os.environ.get('MNISTFLOW_TEST_FAULTS')}: {e!r}\n")
    os._exit(3)

for _entry in sys.path:  # the sitecustomize this one shadows
    _other = Path(_entry or ".").resolve() / "sitecustomize.py"
    if _other.parent != _HERE and _other.is_file():
        _load("_shadowed_sitecustomize", _other)
        break
