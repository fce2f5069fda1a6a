"""Labels 1..5 through the command line, as a user meets them: prep, records, train, predict,
eval all speak 1..5 (no phantom class 0, issue 20)."""
from __future__ import annotations

import json

import numpy as np
from helpers.cli import run_cli
from helpers.synthetic import digits


def _csv(path, x: np.ndarray, y: np.ndarray) -> None:
    rows = [",".join(map(str, [int(lab), *img.ravel()])) for img, lab in zip(x, y)]
    path.write_text("label," + ",".join(f"p{i}" for i in range(x[0].size)) + "\n" + "\n".join(rows) + "\n")


def test_labels_1_to_5_stay_1_to_5_from_prep_to_eval(tmp_path):
    from PIL import Image

    x, y = digits(600, classes=5, seed=1)
    tx, ty = digits(100, classes=5, seed=2)
    _csv(tmp_path / "train.csv", x, y + 1)  # labels 1..5
    _csv(tmp_path / "test.csv", tx, ty + 1)
    rec = tmp_path / "rec"
    proc = run_cli("prep", "--data", str(tmp_path / "train.csv"), "--out", str(rec), "--val-size", "50")
    assert proc.returncode == 0, proc.stderr
    assert "5 classes, labels 1..5" in proc.stdout

    proc = run_cli("records", str(rec))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    head = next(i for i, ln in enumerate(out) if ln.split() == ["label", "name", "train", "val", "test"])
    rows = [ln.split() for ln in out[head + 1:head + 6]]
    assert [r[:2] for r in rows] == [[str(v), str(v)] for v in range(1, 6)]
    assert [int(r[4]) for r in rows] == np.bincount(ty, minlength=5).tolist()
    assert sum(int(r[2]) + int(r[3]) for r in rows) == 600

    run = tmp_path / "run"
    proc = run_cli("train", "--recipe", "softmax", "--data", str(rec), "--run-dir", str(run),
                   "--max-steps", "60", "--no-tensorboard", "--threads", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr

    pngs = []
    for i in range(10):
        pngs.append(tmp_path / f"{i}.png")
        Image.fromarray(tx[i, ..., 0]).save(pngs[-1])
    proc = run_cli("predict", str(run), *map(str, pngs), "--json")
    assert proc.returncode == 0, proc.stderr
    preds = json.loads(proc.stdout)
    assert all(1 <= p["label"] <= 5 and p["name"] == str(p["label"]) for p in preds)
    assert all(len(p["probabilities"]) == 5 for p in preds)  # 5 outputs, no empty class 0
    assert sum(p["label"] == t + 1 for p, t in zip(preds, ty[:10])) >= 8

    proc = run_cli("eval", str(run), "--data", str(rec))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    table = lines[lines.index(next(ln for ln in lines if ln.split()[:3] == ["label", "images", "accuracy"])) + 1:][:5]
    assert [ln.split()[0] for ln in table] == ["1", "2", "3", "4", "5"]
    assert [int(ln.split()[1]) for ln in table] == np.bincount(ty, minlength=5).tolist()
    proc = run_cli("eval", str(run), "--data", str(rec), "--json")
    res = json.loads(proc.stdout)
    assert res["label_values"] == [1, 2, 3, 4, 5] and len(res["confusion"]) == 5 and res["acc"] > 0.8
