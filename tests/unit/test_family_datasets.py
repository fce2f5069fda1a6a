"""The MNIST family's known datasets (issue 20): the table (EMNIST's six splits, QMNIST,
mirrors, sums, class names, augmentation policies), EMNIST read from its zip or its separate
files and turned upright, its mapping file, and QMNIST's 2-D int label files. Synthetic files
only, a few KB each."""
from __future__ import annotations

import gzip
import re
import struct
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from helpers.idx_files import idx_bytes, l_glyph
from mnistflow.core.errors import MnistflowError
from mnistflow.data import known
from mnistflow.data.formats import detect_format, read_known
from mnistflow.data.formats.emnist import read_emnist, read_emnist_mapping
from mnistflow.data.known import EMNIST_SPLITS, KNOWN, RemoteFile, lookup
from mnistflow.data.formats.idx import ZipMember, read_idx, read_idx_pair
from mnistflow.data.formats.raw import from_original_labels

# --- synthetic files ----------------------------------------------------------------------


def assert_upright_l(img: np.ndarray) -> None:
    img = img.reshape(28, 28)
    assert (img == l_glyph()).all()
    cols, rows = img.sum(0), img.sum(1)
    assert int(np.argmax(cols)) < 14, "the vertical bar should be on the left"
    assert int(np.argmax(rows)) > 14, "the foot should be at the bottom"


LETTERS_MAPPING = "".join(f"{i} {64 + i} {96 + i}\n" for i in range(1, 27))


def emnist_arrays(split: str = "letters", n: int = 52):
    """(images as EMNIST stores them, i.e. transposed, labels) for ``split``."""
    x = np.stack([l_glyph().T] * n)  # stored transposed, as NIST does
    y = (np.arange(n) % 26 + 1) if split == "letters" else (np.arange(n) % 10)
    return x, y.astype(np.uint8)


def write_emnist_zip(folder: Path, split: str = "letters", mapping: str | None = LETTERS_MAPPING,
                     n: int = 52, prefix: str = "gzip/") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    x, y = emnist_arrays(split, n)
    path = folder / "gzip.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for s in ("train", "test"):
            z.writestr(f"{prefix}emnist-{split}-{s}-images-idx3-ubyte.gz", gzip.compress(idx_bytes(x)))
            z.writestr(f"{prefix}emnist-{split}-{s}-labels-idx1-ubyte.gz", gzip.compress(idx_bytes(y)))
        if mapping is not None:
            z.writestr(f"{prefix}emnist-{split}-mapping.txt", mapping)
    return path


def write_emnist_loose(folder: Path, split: str = "letters", mapping: str | None = LETTERS_MAPPING,
                       gz: bool = True, n: int = 52) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    x, y = emnist_arrays(split, n)
    for s in ("train", "test"):
        for kind, arr in (("images-idx3", x), ("labels-idx1", y)):
            data = idx_bytes(arr)
            name = f"emnist-{split}-{s}-{kind}-ubyte"
            if gz:
                (folder / (name + ".gz")).write_bytes(gzip.compress(data))
            else:
                (folder / name).write_bytes(data)
    if mapping is not None:
        (folder / f"emnist-{split}-mapping.txt").write_text(mapping)


def qmnist_labels(digits: np.ndarray) -> np.ndarray:
    """QMNIST's label rows: digit, NIST class, writer id, ... (8 int32 columns)."""
    rows = np.zeros((len(digits), 8), np.int32)
    rows[:, 0] = digits
    rows[:, 1] = 48 + digits  # NIST's class code: not a class
    rows[:, 2] = 1000 + np.arange(len(digits))  # the writer: not a class either
    return rows


def write_qmnist(folder: Path, n: int = 40) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in ("train", "test"):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = np.arange(n) % 10
        (folder / f"qmnist-{s}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(x)))
        (folder / f"qmnist-{s}-labels-idx2-int.gz").write_bytes(
            gzip.compress(idx_bytes(qmnist_labels(y), 0x0C)))


def with_local_sums(monkeypatch, name: str, folder: Path) -> known.KnownDataset:
    """Make ``name``'s published sums those of the synthetic files in ``folder``."""
    import hashlib

    ds = KNOWN[name]
    files = tuple(RemoteFile(f.name, hashlib.md5((folder / f.name).read_bytes()).hexdigest())
                  for f in ds.files)
    patched = replace(ds, files=files)
    monkeypatch.setitem(KNOWN, name, patched)
    return patched


# --- the table ------------------------------------------------------------------------------

def test_every_family_member_is_known_with_mirrors_sums_names_and_policy():
    expected = {"mnist", "fashion-mnist", "kmnist", "qmnist", "cifar10",
                *(f"emnist-{s}" for s in ("letters", "digits", "balanced", "byclass", "bymerge", "mnist"))}
    assert expected <= set(KNOWN)
    for name, ds in KNOWN.items():
        assert ds.name == name and lookup(name) is ds
        assert ds.mirrors and all(m.startswith(("http://", "https://")) and m.endswith("/")
                                  for m in ds.mirrors), name
        assert all(re.fullmatch(r"[0-9a-f]{32}", f.md5) for f in ds.files), name
        assert len(set(ds.class_names)) == len(ds.class_names) > 1, name
        assert len(ds.names) == len(ds.class_names), name
    policy = {n: ds.augment for n, ds in KNOWN.items()}
    assert policy["fashion-mnist"] == "clothing" and policy["cifar10"] == "photos"
    assert {policy[n] for n in expected - {"fashion-mnist", "cifar10"}} == {"glyphs"}


def test_emnist_splits_share_one_published_zip_and_have_their_class_counts():
    counts = {"letters": 26, "digits": 10, "mnist": 10, "balanced": 47, "bymerge": 47, "byclass": 62}
    assert set(counts) == set(EMNIST_SPLITS)
    for split, k in counts.items():
        ds = KNOWN[f"emnist-{split}"]
        assert ds.format == "emnist" and ds.split == split and ds.home == "emnist"
        assert [(f.name, f.md5) for f in ds.files] == [("gzip.zip", "58c8d27c78d21e728a6bc7b3cc06412e")]
        assert any("biometrics.nist.gov" in m for m in ds.mirrors)
        assert len(ds.class_names) == k, split
    letters = KNOWN["emnist-letters"].names
    assert letters[1] == "a" and letters[26] == "z" and 0 not in letters  # no phantom class 0
    byclass = KNOWN["emnist-byclass"].class_names
    assert byclass[:10] == tuple("0123456789") and byclass[10] == "A" and byclass[36] == "a"
    balanced = KNOWN["emnist-balanced"].class_names
    assert "c" not in balanced and "C" in balanced and balanced[36:] == tuple("abdefghnqrt")


def test_qmnist_files_and_published_sums_match_torchvision():
    ds = KNOWN["qmnist"]
    assert [(f.name, f.md5) for f in ds.files] == [
        ("qmnist-train-images-idx3-ubyte.gz", "ed72d4157d28c017586c42bc6afe6370"),
        ("qmnist-train-labels-idx2-int.gz", "0058f8dd561b90ffdd0f734c6a30e5e4"),
        ("qmnist-test-images-idx3-ubyte.gz", "1394631089c404de565df7b7aeaf9412"),
        ("qmnist-test-labels-idx2-int.gz", "5b5b05890a5e13444e108efe57b788aa"),
    ]
    assert ds.class_names == tuple("0123456789")


def test_lookup_takes_aliases_case_and_underscores_and_refuses_bare_emnist():
    assert lookup("EMNIST_Letters") is KNOWN["emnist-letters"]
    assert lookup("emnistbalanced") is KNOWN["emnist-balanced"]
    assert lookup("fashion_mnist") is KNOWN["fashion-mnist"]
    assert lookup("QMNIST") is KNOWN["qmnist"]
    assert lookup("no-such-set") is None
    with pytest.raises(MnistflowError) as e:
        lookup("emnist")
    for split in EMNIST_SPLITS:
        assert f"emnist-{split}" in str(e.value)


def test_the_by_hand_message_names_the_zip_its_url_and_the_separate_files():
    msg = KNOWN["emnist-letters"].by_hand()
    assert "gzip.zip" in msg and "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip" in msg
    assert "emnist-letters-train-images-idx3-ubyte.gz" in msg and "emnist-letters-mapping.txt" in msg
    assert "qmnist-test-labels-idx2-int.gz" in KNOWN["qmnist"].by_hand()


# --- EMNIST: zip or separate files, upright, names from the mapping --------------------------

def _check_letters(raw) -> None:
    assert raw.class_names == [chr(ord("a") + i) for i in range(26)]
    assert tuple(raw.label_values) == tuple(range(1, 27))  # the original labels stay the ids
    _, y = emnist_arrays()
    assert (raw.train.y == y.astype(np.int64) - 1).all()  # class indices 0..25
    assert raw.train.x.shape == (52, 28, 28, 1) and raw.test is not None
    for img in (raw.train.x[0], raw.train.x[-1], raw.test.x[7]):
        assert_upright_l(img)


def test_emnist_letters_from_the_zip_come_out_upright_named_a_to_z(tmp_path):
    write_emnist_zip(tmp_path)
    raw = read_emnist(KNOWN["emnist-letters"], tmp_path)
    _check_letters(raw)
    assert raw.source_files == [tmp_path / "gzip.zip"]
    assert not list(tmp_path.glob("**/*.gz"))  # read in place, nothing extracted


@pytest.mark.parametrize("gz", [True, False])
def test_emnist_letters_from_separate_files_placed_by_hand(tmp_path, gz):
    write_emnist_loose(tmp_path, gz=gz)
    _check_letters(read_emnist(KNOWN["emnist-letters"], tmp_path))


def test_emnist_without_its_mapping_file_takes_the_table_names(tmp_path):
    write_emnist_loose(tmp_path, mapping=None)
    _check_letters(read_emnist(KNOWN["emnist-letters"], tmp_path))


def test_read_known_reads_emnist_from_data_after_checking_the_published_sum(tmp_path, monkeypatch):
    write_emnist_zip(tmp_path / "emnist")  # the shared sub-folder of every split
    folder = known.locate(KNOWN["emnist-letters"], tmp_path)
    assert folder == tmp_path / "emnist"
    with pytest.raises(MnistflowError, match="checksum does not match the published emnist-letters file gzip.zip"):
        read_known(KNOWN["emnist-letters"], folder)
    raw = read_known(with_local_sums(monkeypatch, "emnist-letters", folder), folder)
    _check_letters(raw)
    assert raw.name == "emnist-letters"


def test_a_digit_split_takes_its_names_from_the_mapping(tmp_path):
    mapping = "".join(f"{i} {48 + i}\n" for i in range(10))
    write_emnist_loose(tmp_path, "digits", mapping=mapping.replace("9 57", "9 88"))  # 9 shown 'X'
    raw = read_emnist(KNOWN["emnist-digits"], tmp_path)
    assert raw.class_names == list("012345678X") and tuple(raw.label_values) == tuple(range(10))
    assert_upright_l(raw.train.x[3])


def test_a_zip_without_the_split_is_an_error_naming_what_is_missing(tmp_path):
    write_emnist_zip(tmp_path, "digits", mapping=None)
    with pytest.raises(MnistflowError, match="is not EMNIST's zip: it has no emnist-letters-train-images"):
        read_emnist(KNOWN["emnist-letters"], tmp_path)


def test_missing_emnist_files_say_what_to_place_where(tmp_path):
    (tmp_path / "emnist-letters-train-images-idx3-ubyte.gz").write_bytes(b"")  # one of four
    with pytest.raises(MnistflowError) as e:
        known.locate(KNOWN["emnist-letters"], tmp_path)
    msg = str(e.value)
    assert msg.startswith(str(tmp_path)) and "gzip.zip" in msg and "emnist-letters-test-labels-idx1-ubyte.gz" in msg


def test_known_files_prefer_the_zip_and_list_the_mapping_of_separate_files(tmp_path):
    ds = KNOWN["emnist-letters"]
    write_emnist_loose(tmp_path)
    files = known.files_in(ds, tmp_path)
    assert [p.name for p in files] == [*ds.loose_files, ds.mapping]
    write_emnist_zip(tmp_path)
    assert known.files_in(ds, tmp_path) == [tmp_path / "gzip.zip"]
    assert known.files_in(KNOWN["emnist-byclass"], tmp_path / "none") is None


@pytest.mark.parametrize("text, error", [
    ("1 65 97\n1 66 98\n", "label 1 is mapped twice"),
    ("1 sixty-five\n", "line 1: expected 'label ascii_code"),
    ("1 65 97 98 99\n", "line 1: expected"),
    ("1 7\n", "line 1: expected"),  # a control character is no class name
    ("-1 65\n", "line 1: expected"),
    ("\n\n", "is empty"),
])
def test_a_bad_mapping_file_is_an_error_naming_the_line(tmp_path, text, error):
    p = tmp_path / "emnist-letters-mapping.txt"
    p.write_text(text)
    with pytest.raises(MnistflowError, match=error):
        read_emnist_mapping(p)


def test_a_huge_mapping_file_is_refused_unread(tmp_path):
    p = tmp_path / "emnist-letters-mapping.txt"
    p.write_bytes(b"1 65\n" * 20000)
    with pytest.raises(MnistflowError, match="not an EMNIST mapping file"):
        read_emnist_mapping(p)


def test_a_folder_of_emnist_or_qmnist_files_asks_for_the_dataset_name(tmp_path):
    write_emnist_loose(tmp_path / "loose")
    write_emnist_zip(tmp_path / "zip")
    write_qmnist(tmp_path / "q")
    for folder, name in (("loose", "emnist-letters"), ("zip", "emnist-<split>"), ("q", "qmnist")):
        with pytest.raises(MnistflowError, match=re.escape(f"holds {name}'s files: name the dataset, "
                                                           f"e.g. mnistflow prep {name} --data")):
            detect_format(tmp_path / folder)


def test_a_folder_or_file_of_one_datasets_own_files_names_that_dataset(tmp_path):
    """``--data`` of EMNIST's split files (or QMNIST's), or of one of them, is that dataset in
    that folder: every verb reads them as ``prep emnist-letters --data DIR`` does."""
    write_emnist_loose(tmp_path / "loose")
    write_emnist_zip(tmp_path / "zip")
    write_qmnist(tmp_path / "q")
    image = tmp_path / "loose" / "emnist-letters-test-images-idx3-ubyte.gz"
    assert known.resolve_input(None, tmp_path / "loose") == ("emnist-letters", tmp_path / "loose")
    assert known.resolve_input(None, image) == ("emnist-letters", tmp_path / "loose")
    assert known.resolve_input(None, tmp_path / "q") == ("qmnist", tmp_path / "q")
    assert known.resolve_input("emnist-digits", image) == ("emnist-digits", image)  # a name given wins
    # the zip holds every split, and a folder of two splits names none: the user says which
    write_emnist_loose(tmp_path / "two", "letters")
    write_emnist_loose(tmp_path / "two", "digits")
    for folder in ("zip", "two"):
        assert known.resolve_input(None, tmp_path / folder) == (None, tmp_path / folder)
    (tmp_path / "mnist").mkdir()  # MNIST's names are Fashion-MNIST's and KMNIST's too
    for f in known.KNOWN["mnist"].files:
        (tmp_path / "mnist" / f.name).write_bytes(b"")
    assert known.owner_of(tmp_path / "mnist") is None


# --- zip members: the IDX reader's checks hold inside a zip --------------------------------

def test_a_zip_member_is_read_like_a_file_and_turned_upright_when_named_as_emnists(tmp_path):
    x = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    with zipfile.ZipFile(tmp_path / "a.zip", "w", zipfile.ZIP_STORED) as z:
        for name in ("plain-idx3-ubyte", "emnist-digits-test-images-idx3-ubyte"):
            z.writestr(f"d/{name}", idx_bytes(x))
            z.writestr(f"d/{name}.gz", gzip.compress(idx_bytes(x)))
    for m in ("d/plain-idx3-ubyte", "d/plain-idx3-ubyte.gz"):
        assert (read_idx(ZipMember(tmp_path / "a.zip", m)) == x).all()
    for m in ("d/emnist-digits-test-images-idx3-ubyte", "d/emnist-digits-test-images-idx3-ubyte.gz"):
        t = read_idx(ZipMember(tmp_path / "a.zip", m))
        assert (t == x.transpose(0, 2, 1)).all() and not t.flags.writeable


def test_a_forged_header_in_a_zip_member_fails_before_allocating(tmp_path):
    head = bytes([0, 0, 8, 3]) + struct.pack(">III", 10**6, 28, 28)  # 784 MB promised
    with zipfile.ZipFile(tmp_path / "a.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x-idx3-ubyte.gz", gzip.compress(head + bytes(100)))
        z.writestr("x-idx3-ubyte", head + bytes(100))
    with pytest.raises(MnistflowError, match="more than this .*gzip file can hold"):
        read_idx(ZipMember(tmp_path / "a.zip", "x-idx3-ubyte.gz"))
    with pytest.raises(MnistflowError, match=r"a.zip:x-idx3-ubyte: truncated"):
        read_idx(ZipMember(tmp_path / "a.zip", "x-idx3-ubyte"))


def test_a_corrupt_zip_member_or_archive_is_one_error_naming_it(tmp_path):
    x = np.zeros((50, 28, 28), np.uint8)
    good = tmp_path / "a.zip"
    with zipfile.ZipFile(good, "w", zipfile.ZIP_STORED) as z:
        z.writestr("m-idx3-ubyte.gz", gzip.compress(idx_bytes(x), 0))
    data = bytearray(good.read_bytes())
    i = data.index(b"\x1f\x8b") + 200
    data[i:i + 50] = b"\xff" * 50  # inside the stored deflate stream
    (tmp_path / "bad.zip").write_bytes(bytes(data))
    with pytest.raises(MnistflowError, match="bad.zip:m-idx3-ubyte.gz"):
        read_idx(ZipMember(tmp_path / "bad.zip", "m-idx3-ubyte.gz"))
    (tmp_path / "junk.zip").write_bytes(b"not a zip at all")
    with pytest.raises(MnistflowError, match="junk.zip: not a readable zip archive"):
        read_idx(ZipMember(tmp_path / "junk.zip", "m-idx3-ubyte.gz"))
    with pytest.raises(MnistflowError, match="a.zip: has no member other"):
        read_idx(ZipMember(good, "other"))


EMNIST_NAME = "emnist-letters-train-images-idx3-ubyte"  # a name the IDX reader turns upright


@pytest.mark.parametrize("name, turned", [
    (EMNIST_NAME, True), (EMNIST_NAME + ".gz", True), ("emnist-byclass-test-images-idx3-ubyte.gz", True),
    ("emnist-letters-train-labels-idx1-ubyte", False), ("train-images-idx3-ubyte", False),
    ("my-emnist-letters-train-images-idx3-ubyte", False), ("emnist-letters-train-images-idx3-ubyte.bak", False),
])
def test_emnists_image_files_are_told_by_their_name(name, turned):
    from mnistflow.data.formats.idx import stored_transposed

    assert stored_transposed(Path("/some/where") / name) is turned
    assert stored_transposed(ZipMember(Path("gzip.zip"), f"gzip/{name}")) is turned


def test_transposing_needs_square_images(tmp_path):
    p = tmp_path / EMNIST_NAME
    p.write_bytes(idx_bytes(np.zeros((2, 28, 20), np.uint8)))
    with pytest.raises(MnistflowError, match="expected square images"):
        read_idx(p)


def test_transposing_an_empty_image_file_gives_an_empty_array(tmp_path):
    p = tmp_path / EMNIST_NAME
    p.write_bytes(idx_bytes(np.zeros((0, 28, 28), np.uint8)))
    assert read_idx(p).shape == (0, 28, 28)


def test_transposing_works_in_chunks_over_many_images(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (12001, 28, 28), dtype=np.uint8)  # 3 chunks
    p = tmp_path / EMNIST_NAME
    p.write_bytes(idx_bytes(x))
    assert (read_idx(p) == x.transpose(0, 2, 1)).all()


# --- QMNIST: 2-D int label rows ------------------------------------------------------------

def test_qmnist_label_rows_give_their_first_column(tmp_path):
    write_qmnist(tmp_path)
    x, y = read_idx_pair(tmp_path / "qmnist-train-images-idx3-ubyte.gz",
                         tmp_path / "qmnist-train-labels-idx2-int.gz")
    assert y.dtype == np.int64 and (y == np.arange(40) % 10).all() and x.shape == (40, 28, 28, 1)


def test_qmnist_reads_as_a_known_dataset_with_ten_digit_classes(tmp_path, monkeypatch):
    write_qmnist(tmp_path)
    with pytest.raises(MnistflowError, match="checksum does not match the published qmnist"):
        read_known(KNOWN["qmnist"], known.locate(KNOWN["qmnist"], tmp_path))
    raw = read_known(with_local_sums(monkeypatch, "qmnist", tmp_path), tmp_path)
    assert raw.class_names == list("0123456789") and raw.num_classes == 10
    assert (raw.test.y == np.arange(40) % 10).all()


@pytest.mark.parametrize("labels, error", [
    (np.zeros((4, 0), np.int32), "expected a rank-1 label file"),
    (np.zeros((4, 2, 2), np.int32), "expected a rank-1 label file"),
    (np.full((4, 8), -3, np.int32), "record 0: label -3 is negative"),
])
def test_bad_qmnist_style_labels_are_errors(tmp_path, labels, error):
    (tmp_path / "i-idx3-ubyte").write_bytes(idx_bytes(np.zeros((4, 28, 28), np.uint8)))
    (tmp_path / "l-idx2-int").write_bytes(idx_bytes(labels, 0x0C))
    with pytest.raises(MnistflowError, match=error):
        _, y = read_idx_pair(tmp_path / "i-idx3-ubyte", tmp_path / "l-idx2-int")
        from_original_labels(y, None, None, where="l")


def test_float_labels_are_refused(tmp_path):
    (tmp_path / "i-idx3-ubyte").write_bytes(idx_bytes(np.zeros((2, 28, 28), np.uint8)))
    head = bytes([0, 0, 0x0D, 1]) + struct.pack(">I", 2)
    (tmp_path / "l-idx1").write_bytes(head + np.array([0.5, 1.0], ">f4").tobytes())
    with pytest.raises(MnistflowError, match="expected integer labels, got >f4"):
        read_idx_pair(tmp_path / "i-idx3-ubyte", tmp_path / "l-idx1")
