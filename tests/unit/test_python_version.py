"""pyproject.toml's ``requires-python`` is true of the code: vermin reads every module of the
package statically (in-process, through its Python API) and the newest Python any of them needs
must not be newer than the declared minimum (``tomllib``, 3.11+, once broke 3.10)."""
from __future__ import annotations

import re
from pathlib import Path

import vermin

from mnistflow.core.compat import tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "mnistflow"


def declared_minimum() -> tuple[int, int]:
    with open(REPO / "pyproject.toml", "rb") as f:
        spec = tomllib().load(f)["project"]["requires-python"]
    m = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec.strip())
    assert m, f"requires-python {spec!r}: expected '>=X.Y'"
    return int(m[1]), int(m[2])


def needs(source: str, path: str = "<source>") -> tuple[tuple[int, int] | None, list[str]]:
    """(the oldest Python 3 that runs ``source``, vermin's reasons for it). ``None``: no Python 3
    runs it (vermin found requirements that contradict each other, or cannot parse it)."""
    config = vermin.Config()
    config.set_verbose(3)  # the reasons, one line each: 'L6 C7: 'tomllib' module requires !2, 3.11'
    visitor = vermin.visit(source, config, path)
    if not isinstance(visitor, vermin.SourceVisitor):  # unparsable: the versions that parse it
        return (tuple(visitor[1]) if visitor[1] else None), ["cannot be parsed by older Pythons"]
    py3 = visitor.minimum_versions()[1]
    if py3 is None:
        return None, visitor.output_text().splitlines()
    version = "%d.%d" % py3
    return tuple(py3), [ln for ln in visitor.output_text().splitlines() if ln.rstrip().endswith(version)]


def too_new(root: Path, minimum: tuple[int, int]) -> dict[str, list[str]]:
    """Each module under ``root`` that needs a Python newer than ``minimum``, with the reasons."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        version, why = needs(path.read_text(encoding="utf-8"), str(path))
        if version is None or version > minimum:
            out[str(path.relative_to(root.parent))] = [f"needs {version or 'no Python 3'}", *why]
    return out


def test_the_checker_sees_a_newer_module_and_a_guarded_import():
    # what the package test below relies on: an unguarded 3.11 module is seen, a guarded one is not
    assert needs("import tomllib\n")[0] == (3, 11)
    guarded = ("import sys\nif sys.version_info >= (3, 11):\n    import tomllib\n"
               "else:\n    import tomli as tomllib\n")
    assert needs(guarded)[0] < (3, 10)
    assert needs("from itertools import pairwise\n")[0] == (3, 10)


def test_requires_python_is_true_of_every_module():
    minimum = declared_minimum()
    assert minimum >= (3, 8)  # the check below is only as good as the version it is held to
    bad = too_new(PACKAGE, minimum)
    assert not bad, f"modules newer than requires-python >= {minimum[0]}.{minimum[1]}:\n" + "\n".join(
        f"  {path}: " + "; ".join(why) for path, why in bad.items())
