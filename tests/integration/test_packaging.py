"""What a user downloads: the sdist and the wheel, built as pip would (sdist first, the wheel from
the unpacked sdist), carry the license, the PEP 561 marker, the C sources and the metadata; the
sdist carries the test suite, and its unit tests run from the unpacked sdist.

The build calls setuptools' PEP 517 hooks in this interpreter (no build isolation, no network),
on a copy of the source tree so that nothing (egg-info, build/) is written into the checkout."""
from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers.cli import REPO

setuptools = pytest.importorskip("setuptools")
if int(setuptools.__version__.split(".")[0]) < 77:  # pyproject's build-system needs 77 (PEP 639)
    pytest.skip(f"setuptools {setuptools.__version__} < 77", allow_module_level=True)

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
# Run from the unpacked sdist: the repo-relative ones (pyproject's import contracts and
# requires-python, the C header against the bindings) prove the sdist is a complete source tree.
SDIST_UNIT_TESTS = ["tests/unit/test_layers.py", "tests/unit/test_python_version.py",
                    "tests/unit/test_kernels_abi.py", "tests/unit/test_records_synthetic.py"]


def _not_source(directory: str, names: list[str]) -> set[str]:
    """What a source tree holds besides the sources: VCS data, virtual environments, caches,
    build outputs and runs (copying them would be slow and could leak into the sdist)."""
    out = set()
    for n in names:
        p = Path(directory, n)
        if (n.startswith(".") or n in {"__pycache__", "build", "dist", "runs", "test-artifacts"}
                or n.endswith((".egg-info", ".pyc")) or (p / "pyvenv.cfg").exists()):
            out.add(n)
    return out


def _hook(name: str, source: Path, out: Path) -> Path:
    """Run setuptools' PEP 517 hook ``build_sdist``/``build_wheel`` in ``source``; the built file."""
    out.mkdir()
    code = f"import sys; from setuptools import build_meta as b; print(b.{name}(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, str(out)], check=False, cwd=source,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (built,) = out.iterdir()
    return built


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("packaging")
    tree = tmp / "tree"
    shutil.copytree(REPO, tree, ignore=_not_source)
    sdist = _hook("build_sdist", tree, tmp / "sdist")
    with tarfile.open(sdist) as tf:
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.10.12+
        tf.extractall(tmp / "unpacked", **kw)
    (unpacked,) = (tmp / "unpacked").iterdir()
    sdist_names = _sdist_names(sdist)
    wheel = _hook("build_wheel", unpacked, tmp / "wheel")  # as pip does: the wheel from the sdist
    return {"sdist": sdist, "sdist_names": sdist_names, "unpacked": unpacked, "wheel": wheel}


def _sdist_names(sdist: Path) -> set[str]:
    with tarfile.open(sdist) as tf:
        return {m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile()}


def _metadata(text: str):
    return email.parser.Parser().parsestr(text)


def _source_files(sub: str, pattern: str = "*") -> set[str]:
    return {p.relative_to(REPO).as_posix() for p in (REPO / sub).rglob(pattern)
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")}


def test_the_sdist_holds_the_license_the_tests_and_the_c_sources(built):
    names = built["sdist_names"]
    assert {"LICENSE", "README.md", "pyproject.toml", "PKG-INFO", "src/mnistflow/py.typed"} <= names
    # the whole test suite (its pytest configuration is pyproject.toml's) and the native kernels
    assert _source_files("tests", "*.py") <= names, sorted(_source_files("tests", "*.py") - names)
    assert "tests/integration/test_packaging.py" in names and "tests/unit/conftest.py" in names
    csrc = _source_files("src/mnistflow/kernels/csrc")
    assert csrc and csrc <= names, sorted(csrc - names)
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]
    assert "MIT License" in (built["unpacked"] / "LICENSE").read_text()
    meta = _metadata((built["unpacked"] / "PKG-INFO").read_text())
    assert meta["License-Expression"] == "MIT" and meta.get_all("License-File") == ["LICENSE"]


def test_the_wheel_is_typed_licensed_and_carries_its_data_but_not_the_tests(built):
    with zipfile.ZipFile(built["wheel"]) as zf:
        names = set(zf.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = _metadata(zf.read(meta_name).decode())
        info = meta_name.rsplit("/", 1)[0]
        assert "MIT License" in zf.read(f"{info}/licenses/LICENSE").decode()
    assert "mnistflow/py.typed" in names  # PEP 561: type checkers use the package's hints
    csrc = {n.removeprefix("src/") for n in _source_files("src/mnistflow/kernels/csrc")}
    assert csrc and csrc <= names, sorted(csrc - names)  # compiled on first use
    static = {n.removeprefix("src/") for n in _source_files("src/mnistflow/server/static")}
    assert static and static <= names
    assert "mnistflow/training/measured.json" in names  # --target-acc reads it at run time
    assert not [n for n in names if n.startswith(("tests/", "helpers/", "benchmarks/", "examples/"))]

    assert meta["Name"] == "mnistflow" and meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    classifiers = meta.get_all("Classifier")
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression
    versions = [c.rsplit(" :: ", 1)[1] for c in classifiers
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert versions == PYTHONS, classifiers
    # the oldest Python listed is the one requires-python declares
    assert meta["Requires-Python"] == f">={PYTHONS[0]}"
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Operating System :: ") for c in classifiers)
    assert any(c.startswith("Topic :: ") for c in classifiers)
    assert meta["Description-Content-Type"] == "text/markdown" and "mnistflow" in meta.get_payload()


def test_unit_tests_run_from_the_unpacked_sdist(built, tmp_path):
    src = built["unpacked"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(PYTHONPATH=str(src / "src"), MNISTFLOW_HOME=str(tmp_path / "home"), MNISTFLOW_THREADS="1")
    where = subprocess.run([sys.executable, "-c", "import mnistflow; print(mnistflow.__file__)"],
                           check=False, cwd=src, env=env, capture_output=True, text=True, timeout=60)
    # the sdist's package, not the checkout's (an editable install would otherwise win)
    assert Path(where.stdout.strip()).is_relative_to(src / "src"), where.stdout + where.stderr
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SDIST_UNIT_TESTS],
                       check=False, cwd=src, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    m = re.search(r"(\d+) passed", r.stdout)
    assert m and int(m[1]) >= len(SDIST_UNIT_TESTS) and "failed" not in r.stdout, r.stdout[-2000:]


def test_installing_the_wheel_keeps_the_torch_already_installed(built, tmp_path):
    """mnistflow asks for torch 2.4 or newer with no upper bound, so that installing it never
    replaces a user's newer torch (nor a CPU build by a CUDA one): pip, asked to install the
    wheel into this environment, installs nothing but mnistflow."""
    with zipfile.ZipFile(built["wheel"]) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        requires = _metadata(zf.read(meta_name).decode()).get_all("Requires-Dist")
    assert [r for r in requires if re.match(r"torch\b", r)] == ["torch>=2.4"]
    assert not [r for r in requires if re.match(r"torchvision\b", r)]
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--report",
                        str(report), str(built["wheel"])], check=False, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    planned = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert planned in ([], ["mnistflow"]), planned
