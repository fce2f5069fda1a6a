"""The docs cannot rot: the tutorial's and the README's blocks marked ``runnable`` run, in order,
in one directory; every ``mnistflow`` command in any bash block of any Markdown page names an
existing verb and its existing flags; every ``mnistflow.NAME`` they mention exists; every link
and picture leads to a file and heading that exist; every page in docs/ is linked from the
README, which stays short.

A fenced block whose info string is ``bash runnable`` runs in bash (``set -eo pipefail``); one
marked ``python runnable`` runs in this interpreter. Training that would take minutes is
written ``--epochs ${EPOCHS:-4}`` in the tutorial; here ``EPOCHS`` is a sliver of an epoch.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli import REPO

TUTORIAL = REPO / "docs" / "tutorial.md"
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
# Every Markdown page of the repository: the docs, BENCHMARKS.md, the READMEs beside the code.
PAGES = [*DOCS, *sorted(p for d in ("src", "examples", "benchmarks") for p in (REPO / d).rglob("*.md")),
         *sorted(p for p in REPO.glob("*.md") if p != README)]
README_MAX_BYTES = 15_000
PICTURE_MAX_BYTES = 100_000
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
# What the runnable blocks may be shrunk by (the tutorial reads ${EPOCHS:-4} as 4).
SMALL = {"EPOCHS": "0.05"}


def blocks(text: str) -> list[tuple[str, bool, str, int]]:
    """(language, runnable, code, line) of each fenced code block, in order."""
    return [(m.group(1), "runnable" in m.group(2).split(), m.group(3), text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def runnable(text: str) -> list[tuple[str, str, int]]:
    return [(lang, code, line) for lang, run, code, line in blocks(text) if run]


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_markers_are_understood(doc):
    text = doc.read_text()
    found = blocks(text)
    fences = sum(1 for ln in text.splitlines() if ln.lstrip().startswith("```"))
    assert fences == 2 * len(found), "an unclosed or nested code fence"
    bad = [(lang, line) for lang, run, _, line in found if run and lang not in ("bash", "python")]
    assert not bad, f"runnable blocks must be bash or python: {bad}"


def test_the_tutorial_and_the_readme_run_the_main_verbs():
    cmds = "\n".join(code for lang, code, _ in runnable(TUTORIAL.read_text()) if lang == "bash")
    for verb in ("doctor", "prep", "train", "eval", "report", "summary", "export"):
        assert f"mnistflow {verb}" in cmds, verb
    readme = "\n".join(code for lang, code, _ in runnable(README.read_text()) if lang == "bash")
    for verb in ("prep", "train", "eval", "report"):
        assert f"mnistflow {verb}" in readme, verb


def _commands(code: str) -> list[list[str]]:
    """The words of each ``mnistflow VERB ...`` command in a bash block (``torchrun ... -m
    mnistflow VERB ...`` too), continuation lines joined, comments and pipes cut off."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        for i, w in enumerate(words):
            if w == "mnistflow" and i + 1 < len(words) and (i == 0 or words[i - 1] in ("-m", "time")
                                                            or "=" in words[i - 1]):
                rest = words[i + 1:]
                cut = next((k for k, x in enumerate(rest) if x in ("|", "&&", ";", "||")), len(rest))
                out.append(rest[:cut])
    return out


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_command_in_the_docs_names_a_verb_and_flags_it_has(doc):
    """Cheap and for every bash block, runnable or not: a renamed verb or flag fails here."""
    from mnistflow.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "verb").choices
    seen = 0
    for lang, _, code, line in blocks(doc.read_text()):
        if lang != "bash":
            continue
        for words in _commands(code):
            seen += 1
            assert words and words[0] in sub, f"{doc.name} line {line}: unknown verb in {words}"
            flags = {w.split("=", 1)[0] for w in words[1:] if w.startswith("--")}
            unknown = flags - set(sub[words[0]]._option_string_actions)
            assert not unknown, f"{doc.name} line {line}: mnistflow {words[0]} has no {sorted(unknown)}"
    assert seen or doc not in DOCS or doc.name in ("data.md", "performance.md", "development.md"), "no commands found"


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_api_name_in_the_docs_exists(doc):
    import mnistflow

    names = set(re.findall(r"\bmnistflow\.([a-zA-Z_]\w*)\b(?![./])", doc.read_text()))
    if doc.name == "api.md":  # its table of functions names them bare: `prepare(...)`
        names |= set(re.findall(r"^\| `(\w+)\(", doc.read_text(), re.M))
    missing = sorted(n for n in names if not hasattr(mnistflow, n))
    assert not missing, f"{doc.name} names mnistflow.{missing}, which the public API does not have"


def _anchor(heading: str) -> str:
    """A heading's link anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_in_the_docs_leads_to_a_file_and_heading_that_exist(doc):
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.name}: a link to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", dest.read_text(), re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{doc.name}: no heading for {target}"


def _links(doc: Path) -> set[Path]:
    """The local files ``doc`` links to or shows (``[text](path)``, ``![alt](path)``)."""
    return {(doc.parent / target.partition("#")[0]).resolve()
            for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", doc.read_text())
            if not re.match(r"[a-z]+://", target)}


def test_the_readme_is_short_and_links_every_page_of_the_docs():
    """The README is the first screen, not the manual: at most 15,000 bytes; everything else
    is in docs/, and every page there is one link away."""
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes: move the detail into docs/"
    orphans = sorted(p.name for p in DOCS[1:] if p.resolve() not in _links(README))
    assert not orphans, f"docs/ pages the README does not link: {orphans}"


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_picture_in_the_docs_is_a_small_png_with_words_for_it(doc):
    pictures = re.findall(r"!\[([^\]]*)\]\(([^)\s]+)\)", doc.read_text())
    for alt, target in pictures:
        path = (doc.parent / target).resolve()
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{doc.name}: {target} is not a PNG"
        assert len(data) <= PICTURE_MAX_BYTES, f"{doc.name}: {target} is {len(data):,} bytes"
        assert len(alt.split()) >= 3, f"{doc.name}: {target} needs alt text that says what it shows"
    if doc == README:
        assert len(pictures) == 1, "the README shows one picture"


def _run_blocks(doc: Path, mnist_dir: Path, tmp_path: Path) -> list[tuple[float, int]]:
    """Run ``doc``'s runnable blocks in order in ``tmp_path``; (seconds, line) of each."""
    env = dict(os.environ, MNISTFLOW_DATA=str(mnist_dir), MNISTFLOW_THREADS="1", **SMALL)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    times = []
    for n, (lang, code, line) in enumerate(runnable(doc.read_text())):
        t0 = time.perf_counter()
        if lang == "bash":
            cmd = ["bash", "-c", "set -eo pipefail\n" + code]
        else:
            script = tmp_path / f"_block{n}.py"
            script.write_text(code)
            cmd = [sys.executable, str(script)]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        times.append((time.perf_counter() - t0, line))
        assert proc.returncode == 0, (f"{doc.name} line {line}: the block failed (exit "
                                      f"{proc.returncode})\n--- code\n{code}\n--- stdout\n"
                                      f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
    return times


def test_the_readme_runs_as_written(mnist_dir, tmp_path):
    _run_blocks(README, mnist_dir, tmp_path)
    for rel in ("data/mnist/meta.json", "runs/fast/model.safetensors", "runs/fast/summary.json",
                "runs/fast/config.toml", "runs/fast/metrics.jsonl", "runs/fast/report/index.html"):
        assert (tmp_path / rel).is_file(), rel


@pytest.mark.slow  # ~20 commands, each starting Python and PyTorch: 45-70 s on 2 busy cores
def test_tutorial_runs_as_written(mnist_dir, tmp_path):
    times = _run_blocks(TUTORIAL, mnist_dir, tmp_path)
    # what the tutorial promises to exist afterwards
    for rel in ("data/mnist/meta.json", "runs/softmax/report/index.html", "runs/seed-cnn/report/compare.png",
                "runs/resumable/model.safetensors", "runs/softmax/model.onnx", "runs/digits/model.safetensors"):
        assert (tmp_path / rel).is_file(), rel
    print("block times (s, line):", [(round(t, 1), ln) for t, ln in times])
