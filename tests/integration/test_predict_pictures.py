"""``mnistflow predict`` on pictures as users make them (NEWCOMER.md rows 2 and 15): digits
drawn with Pillow, black on white, thick strokes, large and off-centre, are right by default
(each made as MNIST's digits were, as the served page does) and mostly wrong fed as they are
(``--as-is``); a folder is the pictures in it; the model is a real one trained on MNIST (the
serve tests' ``fast`` run)."""
from __future__ import annotations

import json

import numpy as np
from helpers.cli import assert_one_line_error, run_cli
from helpers.images import drawn_digit, png

import mnistflow


def drawings(folder, **kw) -> list[int]:
    """digits 0..9 drawn into ``folder`` as d0.png..d9.png; their labels."""
    folder.mkdir()
    for k in range(10):
        (folder / f"d{k}.png").write_bytes(png(drawn_digit(k, **kw)))
    return list(range(10))


def labels(proc) -> list[int]:
    assert proc.returncode == 0, proc.stderr
    return [p["label"] for p in json.loads(proc.stdout)]


def test_drawings_are_right_by_default_and_wrong_as_they_are(serve_model, tmp_path):
    truth = drawings(tmp_path / "pngs")
    files = [str(tmp_path / "pngs" / f"d{k}.png") for k in truth]
    prepared = labels(run_cli("predict", str(serve_model), *files, "--json"))
    assert sum(p == t for p, t in zip(prepared, truth)) >= 9, prepared
    raw = labels(run_cli("predict", str(serve_model), *files, "--as-is", "--json"))
    assert sum(p == t for p, t in zip(raw, truth)) <= 4, raw
    # the folder: the same pictures in name order, the same answers
    proc = run_cli("predict", str(serve_model), str(tmp_path / "pngs"), "--json")
    assert labels(proc) == prepared
    assert [p["image"] for p in json.loads(proc.stdout)] == files
    assert {p["preprocess"] for p in json.loads(proc.stdout)} == {"mnist"}


def test_the_api_prepares_pictures_as_the_cli_does(serve_model, tmp_path):
    """Other drawings: white on black, a wider canvas, thinner strokes, a JPEG, a transparent
    canvas (the page's upload takes all of these)."""
    folder = tmp_path / "more"
    folder.mkdir()
    truth = []
    for k in range(10):
        ink = drawn_digit(k, canvas=(640, 400), box=(380, 90, 520, 330), width=14)
        if k % 3 == 0:
            (folder / f"a{k}.png").write_bytes(png(255 - ink))  # white on black
        elif k % 3 == 1:
            (folder / f"a{k}.jpg").write_bytes(png(ink, "JPEG", quality=85))
        else:
            rgba = np.zeros((*ink.shape, 4), np.uint8)  # black strokes on a transparent canvas
            rgba[..., 3] = 255 - ink
            (folder / f"a{k}.png").write_bytes(png(rgba))
        truth.append(k)
    preds = mnistflow.predict(serve_model, folder)
    assert sum(p["label"] == t for p, t in zip(preds, truth)) >= 9, [p["label"] for p in preds]
    raw = mnistflow.predict(serve_model, folder, as_is=True)
    assert {p["preprocess"] for p in raw} == {"none"}
    assert sum(p["label"] == t for p, t in zip(raw, truth)) <= 5, [p["label"] for p in raw]


def test_a_folder_without_pictures_is_one_error_line(serve_model, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("no pictures")
    assert_one_line_error(run_cli("predict", str(serve_model), str(tmp_path / "notes")),
                          "notes: a folder with no pictures (.png, .jpg, .jpeg, .bmp) in it")
    proc = run_cli("predict", str(serve_model), str(tmp_path / "pngs"), "--invert", "auto")
    assert proc.returncode == 2 and "unrecognized arguments: --invert" in proc.stderr
