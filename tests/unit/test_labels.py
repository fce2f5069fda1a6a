"""No phantom classes: the classes of a dataset are the values its labels use (or its names
define), and users see those original values everywhere (issue 20, "Labels, the general rule").

A dataset whose labels are 1..26 makes a 26-way model (not 27 with an empty class 0); predict,
eval, the report and the server say 1..26 (and a..z when the names are known)."""
from __future__ import annotations

import functools
import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.synthetic import prototypes

from mnistflow.artifacts.model_file import load_model, save_model
from mnistflow.artifacts.model_info import META_KEY, ModelInfo, check_model_info, info_from_records
from mnistflow.core.errors import MnistflowError
from mnistflow.data.formats.raw import (
    RawSplit,
    dataset_from_labels,
    from_original_labels,
)
from mnistflow.data.records import FORMAT_VERSION, describe, meta_checksum, open_records
from mnistflow.data.write_records import split_train_val, write_records

LETTERS = {v: string.ascii_lowercase[v - 1] for v in range(1, 27)}  # EMNIST letters: 1..26 = a..z


@functools.lru_cache(maxsize=1)
def _patterns() -> np.ndarray:
    return (prototypes(28) * 255).round().astype(np.uint8)  # made once: ~0.7 s of Python loops


def _protos(values) -> np.ndarray:
    """The clean image of each label value in ``values`` (label v: synthetic pattern v < 28)."""
    return _patterns()[list(values)]


def _images(values, copies: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The clean image of each label value in ``values``, ``copies`` of each, and the labels."""
    x = np.concatenate([_protos(values)] * copies)
    y = np.concatenate([np.asarray(values, np.int64)] * copies)
    return x, y


def _records(tmp_path: Path, values, names=None, *, test_values=None, name="letters", val_size=0,
             out: str = "rec"):
    """A record set whose raw labels are ``values`` (train: 3 copies of each class)."""
    xtr, ytr = _images(values, 3)
    xte, yte = _images(values)
    if test_values is not None:  # a test split holding only these classes
        keep = np.isin(yte, test_values)
        xte, yte = xte[keep], yte[keep]
    raw = dataset_from_labels(name, RawSplit(xtr, ytr), RawSplit(xte, yte), [], names)
    write_records(raw, tmp_path / out, key=name, options={}, source_checksums={}, val_size=val_size)
    return open_records(tmp_path / out)


def _template_model(rec) -> torch.nn.Module:
    """A softmax model that recognises each record class's clean image exactly: output i
    matches the (centred, unit) template of label ``rec.label_values[i]``, so its answers are
    known in advance."""
    from mnistflow.models import create_model

    model = create_model("softmax", (1, 28, 28), rec.num_classes)
    t = _protos(rec.label_values).reshape(rec.num_classes, -1).astype(np.float64)
    t -= t.mean(1, keepdims=True)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    with torch.no_grad():
        model.fc1.weight.copy_(torch.from_numpy(t).float())
        model.fc1.bias.zero_()
    return model.eval()


@pytest.fixture
def letters(tmp_path):
    """(records of labels 1..26 named a..z, a model file trained on them)."""
    rec = _records(tmp_path, list(range(1, 27)), LETTERS)
    path = save_model(tmp_path / "model.safetensors", _template_model(rec), info_from_records("softmax", rec))
    return rec, path


# --- the classes of a dataset ---------------------------------------------------------------

def test_labels_1_to_26_make_26_classes_with_their_own_values_and_names():
    y = np.array([1, 26, 5, 2] + list(range(1, 27)))
    tr, te, values, names = from_original_labels(y, np.array([26, 1]), None)
    assert values == tuple(range(1, 27)) and names == tuple(str(v) for v in range(1, 27))
    assert tr[:4].tolist() == [0, 25, 4, 1] and te.tolist() == [25, 0]  # contiguous indices
    _, _, values, names = from_original_labels(y, None, LETTERS)
    assert values == tuple(range(1, 27)) and names[0] == "a" and names[-1] == "z"
    # a sequence of names defines values 0..len-1 (a folder's classes); unnamed values keep str(v)
    _, _, values, names = from_original_labels(np.array([0, 2, 2]), None, ["cat", "dog", "eel"])
    assert values == (0, 1, 2) and names == ("cat", "dog", "eel")


def test_records_of_labels_1_to_26_have_26_classes(letters):
    rec, path = letters
    assert rec.num_classes == 26 and rec.label_values == tuple(range(1, 27))
    assert rec.class_names == list(string.ascii_lowercase)
    assert rec.meta["format_version"] == FORMAT_VERSION and rec.meta["label_values"] == list(range(1, 27))
    _, info = load_model(path)
    assert info.num_classes == 26 and info.values == list(range(1, 27))
    assert info.label(0) == 1 and info.label(25) == 26


def test_a_test_label_train_never_has_is_one_line_naming_it():
    with pytest.raises(MnistflowError) as e:
        from_original_labels(np.array([1, 2, 3]), np.array([1, 2, 4, 3]), None, where="train.csv",
                             test_where="test.csv")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("test.csv: record 2: test label 4 is not a class")
    assert "classes: 1..3" in msg
    with pytest.raises(MnistflowError, match="test label 27 .*no class name defines it"):
        from_original_labels(np.arange(1, 27), np.array([27]), LETTERS)


def test_the_split_keeps_a_training_image_of_every_class(tmp_path):
    x, y = _images([1, 2, 3], 4)
    x, y = np.concatenate([x, x[:1]]), np.concatenate([y, [4]])  # label 4: a single image
    raw = dataset_from_labels("d", RawSplit(x, y), None, [])
    lone = len(y) - 1
    seed = next(s for s in range(100) if lone in split_train_val(len(y), 3, s)[1])  # the plain split
    tr, va = split_train_val(len(y), 3, seed, raw.train.y)
    assert lone in tr and len(va) == 3 and sorted([*tr, *va]) == list(range(len(y)))
    assert (split_train_val(len(y), 3, seed, raw.train.y)[1] == va).all()  # deterministic
    rec = write_records(raw, tmp_path / "r", key="k", options={}, source_checksums={}, val_size=3, seed=seed)
    counts = open_records(rec).class_counts("train").tolist()
    assert counts[3] == 1 and min(counts) > 0 and sum(counts) == 10 and open_records(rec).size("val") == 3
    # a sizeable set keeps the plain permutation's split
    big = np.arange(1000) % 10
    assert all((a == b).all() for a, b in zip(split_train_val(1000, 100, 1, big), split_train_val(1000, 100, 1)))


def test_a_class_in_val_that_train_cannot_have_is_an_error_naming_it(tmp_path):
    raw = dataset_from_labels("d", RawSplit(*_images([1, 2], 2)), None, [], {1: "one", 2: "two"})
    with pytest.raises(MnistflowError, match=r"class [12] \('(one|two)'\) has val images but no training "
                                             r"image; --val-size 3 leaves 1 training images for 2 classes"):
        write_records(raw, tmp_path / "r", key="k", options={}, source_checksums={}, val_size=3)
    assert not (tmp_path / "r").exists()


def test_a_stray_label_with_known_names_is_kept_as_its_own_class_with_a_warning(capsys):
    y = np.array([1, 2, 3, 40, 26])
    tr, _, values, names = from_original_labels(y, None, LETTERS, where="labels.idx")
    assert values == (*range(1, 27), 40) and names[-1] == "40" and names[0] == "a"
    assert tr.tolist() == [0, 1, 2, 26, 25]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "training label(s) 40 are not among the 26 named classes" in err[0]
    # and labels with a gap but no names: one class per value, with a warning
    _, _, values, _ = from_original_labels(np.array([0, 1, 2, 200]), None, None)
    assert values == (0, 1, 2, 200)
    assert "not consecutive (0, 1, 2, 200)" in capsys.readouterr().err


def test_bad_label_values_are_refused_before_anything_is_sized():
    with pytest.raises(MnistflowError, match="record 1: label -3 is negative"):
        from_original_labels(np.array([1, -3]), None, None)
    with pytest.raises(MnistflowError, match="record 0: label 2147483647 is not a class index"):
        from_original_labels(np.array([2**31 - 1]), None, None)


# --- every raw reader: original values in, classes from the one place ------------------------

def test_readers_give_the_original_values(tmp_path):
    from helpers import tfrecord_writer as W

    from mnistflow.data.formats.csv import read_csv
    from mnistflow.data.formats.folder import read_image_folder
    from mnistflow.data.formats.npz import read_npz
    from mnistflow.data.formats.tfrecord import read_tfrecord_dataset

    x, y = _images([3, 5, 7], 2)
    rows = [",".join(map(str, [int(lab), *img.ravel()])) for img, lab in zip(x, y)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    raw = read_csv(tmp_path / "train.csv")
    assert raw.label_values == (3, 5, 7) and raw.class_names == ["3", "5", "7"]
    assert raw.train.y.tolist() == [0, 1, 2, 0, 1, 2]
    (tmp_path / "test.csv").write_text(",".join(map(str, [8, *x[0].ravel()])) + "\n")
    with pytest.raises(MnistflowError, match=r"test\.csv: record 0: test label 8 is not a class"):
        read_csv(tmp_path / "train.csv")

    np.savez(tmp_path / "d.npz", x_train=x[..., 0], y_train=y, x_test=x[:2, ..., 0], y_test=y[:2])
    raw = read_npz(tmp_path / "d.npz")
    assert raw.label_values == (3, 5, 7) and raw.test.y.tolist() == [0, 1]

    recs = [W.encode_example({"image": img.tobytes(), "label": int(lab)}) for img, lab in zip(x, y)]
    (tmp_path / "t.tfrecord").write_bytes(W.frame(recs))
    raw = read_tfrecord_dataset(tmp_path / "t.tfrecord")
    assert raw.label_values == (3, 5, 7) and raw.class_names == ["3", "5", "7"]

    from PIL import Image
    for name, img in (("cat", x[0]), ("dog", x[1])):  # a folder's classes keep their names
        (tmp_path / "f" / name).mkdir(parents=True)
        Image.fromarray(img[..., 0]).save(tmp_path / "f" / name / "0.png")
    raw = read_image_folder(tmp_path / "f")
    assert raw.class_names == ["cat", "dog"] and raw.label_values == (0, 1)


# --- record sets: format 1 only, with its label values ----------------------------------------

def test_a_record_set_of_another_format_or_without_label_values_is_refused(tmp_path):
    rec = _records(tmp_path, list(range(10)), None)
    assert rec.meta["format_version"] == FORMAT_VERSION == 1 and "0  0" in describe(rec)
    meta = json.loads((rec.path / "meta.json").read_text())

    def refused(change: dict, drop: str | None, fragment: str) -> None:
        m = {**meta, **change}
        m.pop(drop, None)
        m["meta_sha256"] = meta_checksum(m)
        (rec.path / "meta.json").write_text(json.dumps(m))
        with pytest.raises(MnistflowError, match=fragment + ".*re-run 'mnistflow prep --force'"):
            open_records(rec.path)

    refused({"format_version": 2}, None, "holds record format 2; this mnistflow reads format 1")
    refused({"format_version": True}, None, "holds record format True")
    refused({}, "label_values", "metadata lacks 'label_values'")


# --- old files keep working -------------------------------------------------------------------


def test_an_old_model_file_without_label_values_predicts_its_output_index(tmp_path):
    from safetensors.torch import save

    from mnistflow.inference import prediction

    rec = _records(tmp_path, list(range(10)), None)
    d = json.loads(info_from_records("softmax", rec).to_json())
    del d["label_values"]
    sd = {k: v.contiguous() for k, v in _template_model(rec).state_dict().items()}
    (tmp_path / "old.safetensors").write_bytes(save(sd, metadata={META_KEY: json.dumps(d)}))
    _, info = load_model(tmp_path / "old.safetensors")
    assert info.label_values is None and info.values == list(range(10))
    p = prediction(info, np.eye(10)[7])
    assert p["label"] == 7 and p["index"] == 7 and p["name"] == "7"


def test_model_info_refuses_label_values_that_do_not_fit_its_classes():
    good = json.loads(ModelInfo("softmax", [1, 28, 28], ["a", "b"], [0.0], [1.0], label_values=[1, 2]).to_json())
    assert check_model_info(good).values == [1, 2]
    for bad in ([1], [1, 1], [1, -2], [1, "2"], "12"):
        with pytest.raises(MnistflowError, match="label_values must be 2 distinct"):
            check_model_info({**good, "label_values": bad})


# --- predict, eval, report and server speak the original values -----------------------------

def test_predict_says_the_original_label_and_its_name(letters, tmp_path):
    from PIL import Image

    from mnistflow.inference import format_predictions, predict

    _, path = letters
    files = []
    for v in (1, 5, 26):  # classes a, e, z
        files.append(tmp_path / f"{v}.png")
        Image.fromarray(_protos([v])[0, ..., 0]).save(files[-1])
    preds = predict(path, files)
    assert [(p["label"], p["name"], p["index"]) for p in preds] == [(1, "a", 0), (5, "e", 4), (26, "z", 25)]
    assert len(preds[0]["probabilities"]) == 26 and preds[0]["labels"] == list(range(1, 27))
    assert format_predictions(preds).splitlines()[2].split()[1] == "e"


def test_eval_speaks_the_original_labels_and_names(letters):
    from mnistflow.inference import evaluate, format_eval

    rec, path = letters
    res = evaluate(path, data=rec.path, device="cpu")
    assert res["acc"] == 1.0 and res["n"] == 26
    assert res["label_values"] == list(range(1, 27)) and res["class_names"][0] == "a"
    assert res["per_class_n"] == [1] * 26 and len(res["confusion"]) == 26
    text = format_eval(res).splitlines()
    assert text[2].split() == ["label", "name", "images", "accuracy"]
    assert text[3].split() == ["1", "a", "1", "100.00%"] and text[28].split() == ["26", "z", "1", "100.00%"]
    matrix = text[text.index("confusion matrix (rows: true, columns: predicted)") + 1:]
    assert matrix[0].split() == list(string.ascii_lowercase) and matrix[1].split()[:2] == ["a", "1"]


def test_eval_maps_other_records_onto_the_model_by_label_value(letters, tmp_path):
    from mnistflow.inference import evaluate

    _, path = letters
    # records of three classes only: their class indices 0..2 are the model's outputs 2..4
    sub = _records(tmp_path, [3, 4, 5], {3: "c", 4: "d", 5: "e"}, out="sub")
    res = evaluate(path, data=sub.path, device="cpu")
    assert res["acc"] == 1.0 and res["per_class_n"][2:5] == [1, 1, 1] and sum(res["per_class_n"]) == 3
    # a class the model was never trained on: one line naming it
    other = _records(tmp_path, [3, 27], None, out="other")
    with pytest.raises(MnistflowError, match="the data has class 27, which the model"):
        evaluate(path, data=other.path, device="cpu")


def test_report_predictions_use_the_models_classes(letters, tmp_path):
    from mnistflow.reporting.run import predict_split

    _, path = letters
    run = tmp_path / "run"
    run.mkdir()
    path.rename(run / "model.safetensors")
    sub = _records(tmp_path, [3, 4, 5], {3: "c", 4: "d", 5: "e"}, out="sub")
    res = predict_split(run, data=sub.path, device="cpu")
    assert res.labels.tolist() == [2, 3, 4] and res.acc == 1.0
    assert res.label_values == list(range(1, 27)) and res.confusion.shape == (26, 26)
    assert [res.class_names[i] for i in res.labels] == ["c", "d", "e"]


def test_the_server_answers_with_the_original_label(letters):
    from mnistflow.artifacts.predictor import TorchBackend
    from mnistflow.server.app import classify
    from mnistflow.server.app import describe as describe_model

    _, path = letters
    model, info = load_model(path)
    pred = TorchBackend(model, info)
    body = json.dumps({"pixels": _protos([5])[0, ..., 0].tolist()}).encode()
    res = classify(pred, body, "application/json", "none")
    assert (res["label"], res["name"], res["class_name"], res["index"]) == (5, "e", "e", 4)
    assert describe_model(pred)["label_values"] == list(range(1, 27))


# --- mnistflow records -------------------------------------------------------------------------

def test_records_shows_each_class_with_its_counts_per_split(tmp_path, capsys):
    from mnistflow.cli import main

    rec = _records(tmp_path, [1, 2, 3], {1: "a", 2: "b", 3: "c"}, test_values=[1, 3], val_size=2)
    counts = {s: rec.class_counts(s).tolist() for s in ("train", "val", "test")}
    assert [sum(c) for c in counts.values()] == [7, 2, 2] and counts["test"] == [1, 0, 1]
    assert main(["records", str(rec.path)]) in (0, None)
    out = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("classes   3: labels 1..3") for ln in out)
    head = out.index(next(ln for ln in out if ln.split() == ["label", "name", "train", "val", "test"]))
    rows = [ln.split() for ln in out[head + 1:head + 5]]
    assert rows[:3] == [[str(v), n, str(counts["train"][i]), str(counts["val"][i]), str(counts["test"][i])]
                        for i, (v, n) in enumerate(zip((1, 2, 3), "abc"))]
    assert rows[3] == ["total", "7", "2", "2"]



def test_records_whose_classes_are_named_otherwise_are_matched_by_value_with_a_warning(tmp_path):
    """eval of a letters model on records whose labels 1.. are named otherwise (cat, dog, ...)
    matched them by label value without a word."""
    from mnistflow.artifacts.model_info import outputs_of_records
    from mnistflow.core import log

    letters = _records(tmp_path, list(range(1, 27)), LETTERS, out="letters")
    info = info_from_records("softmax", letters)
    pets = _records(tmp_path, [1, 2], {1: "cat", 2: "dog"}, name="pets", out="pets")
    with log.recording() as said:
        assert outputs_of_records(info, pets, "test") == [0, 1]
    assert said == [f"{pets.path}: its classes are named otherwise than the model's (2 of them, e.g. label 1: "
                    "'cat' there, 'a' in the model); they are matched by label value"]
    with log.recording() as said:
        assert outputs_of_records(info, letters, "test") is None  # its own records: nothing said
    assert said == []
