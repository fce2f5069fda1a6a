"""The data-layer reproductions of HOSTILE-INPUTS.md (issue 19: D1, D3, D4, D9, D11, D13, D14,
D15), run as a user would: ``mnistflow prep``/``records``/``train`` in a subprocess, the one
line error contract, and the process's peak memory (its own rusage) far below what the
hostile file used to make it take (gigabytes)."""
from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import assert_one_line_error, run_cli
from helpers.images import bomb_png
from helpers.memory import run_measured

MiB = 1 << 20
SMALL_RSS_KB = 250 * 1024  # a failing prep needs ~35 MB; the defects took 1.5 to 6 GB


def zeros_gz(path: Path, nbytes: int) -> Path:
    co = zlib.compressobj(1, zlib.DEFLATED, 31)
    block = b"\0" * (16 * MiB)
    with open(path, "wb") as f:
        f.writelines(co.compress(block) for _ in range(nbytes // len(block)))
        f.write(co.flush())
    return path


def idx_gz(path: Path, shape, data: bytes, code: int = 0x08) -> None:
    head = bytes([0, 0, code, len(shape)]) + b"".join(struct.pack(">I", s) for s in shape)
    path.write_bytes(gzip.compress(head + data))


def no_leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_d1_cifar_bomb_is_refused_in_small_memory(tmp_path):
    n = 500_000
    p = (b"(S'data'\ncnumpy\nndarray\n((I%d\nI3072\ntcnumpy\ndtype\n(S'u1'\ntRtR" % n
         + b"S'labels'\n](" + b"K\x00" * n + b"ed.")
    bomb = tmp_path / "cifar-bomb.tar.gz"
    with tarfile.open(bomb, "w:gz") as t:
        ti = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        ti.size = len(p)
        t.addfile(ti, io.BytesIO(p))
    proc, rss = run_measured("prep", "--data", str(bomb), "--out", str(tmp_path / "cb"), "--val-size", "1")
    assert_one_line_error(proc, "data_batch_1", "refusing to unpickle")  # was rc 0, 4.7 GB RSS
    assert rss < SMALL_RSS_KB, rss
    assert not (tmp_path / "cb").exists() and no_leftovers(tmp_path) == []


def test_d3_huge_idx_label_is_one_line_in_small_memory(tmp_path):
    src = tmp_path / "lab"
    src.mkdir()
    y = np.zeros(10, ">i4")
    y[0] = 2**31 - 1
    idx_gz(src / "train-images-idx3-ubyte.gz", (10, 28, 28), bytes(10 * 784))
    idx_gz(src / "train-labels-idx1-ubyte.gz", (10,), y.tobytes(), code=0x0C)
    proc, rss = run_measured("prep", "--data", str(src), "--out", str(tmp_path / "o"), "--val-size", "1")
    assert_one_line_error(proc, "train-labels-idx1-ubyte.gz", "label 2147483647 is not a class index")
    assert rss < SMALL_RSS_KB, rss  # was a MemoryError traceback at 2.85 GB


@pytest.fixture(scope="module")
def bomb_gz(tmp_path_factory) -> Path:
    """512 MiB of zeros as a 2 MB gzip (the reproduction used 2 GiB; any size shows it)."""
    return zeros_gz(tmp_path_factory.mktemp("gz") / "zeros.gz", 512 * MiB)


def test_d4_idx_gzip_bomb_is_not_inflated(tmp_path, bomb_gz):
    src = tmp_path / "gz"
    src.mkdir()
    shutil.copy(bomb_gz, src / "train-images-idx3-ubyte.gz")
    idx_gz(src / "train-labels-idx1-ubyte.gz", (1,), b"\0")
    proc, rss = run_measured("prep", "--data", str(src), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "train-images-idx3-ubyte.gz", "unknown IDX data type 0x00")
    assert rss < SMALL_RSS_KB, rss  # was 4.2 GB for 2 GiB


def test_d4_tfrecord_gzip_bomb_is_not_inflated(tmp_path, bomb_gz):
    p = shutil.copy(bomb_gz, tmp_path / "bomb.tfrecord.gz")
    proc, rss = run_measured("prep", "--data", str(p), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "bomb.tfrecord.gz", "record 0: length CRC mismatch")
    assert rss < SMALL_RSS_KB, rss


def test_d4_csv_gzip_with_a_huge_line_is_not_inflated(tmp_path):
    p = tmp_path / "huge.csv.gz"
    co = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(p, "wb") as f:
        f.write(co.compress(b"1,"))
        f.writelines(co.compress(b"0," * (8 * MiB)) for _ in range(16))  # 256 MiB on one line
        f.write(co.compress(b"0\n") + co.flush())
    proc, rss = run_measured("prep", "--data", str(p), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "huge.csv.gz", "line 1 is longer than")
    assert rss < SMALL_RSS_KB, rss  # was 6.3 GB for a 1 GiB line


def test_d9_folder_of_decompression_bombs_is_refused_before_decoding(tmp_path):
    bomb = bomb_png(12000, 12000)  # 17 KB each, 144 Mpx
    for c in "01":
        (tmp_path / "f" / c).mkdir(parents=True)
        for i in range(5):
            (tmp_path / "f" / c / f"{i}.png").write_bytes(bomb)
    proc, rss = run_measured("prep", "--data", str(tmp_path / "f"), "--out", str(tmp_path / "fo"),
                             "--val-size", "1")
    assert_one_line_error(proc, "0.png", "12000x12000", "more than the limit of 16,777,216")
    assert rss < SMALL_RSS_KB, rss  # was rc 0 at 2.9 GB and 1.4 GB of records
    assert not (tmp_path / "fo").exists()


def _wait_for(pred, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_d11_a_killed_prep_leaves_nothing_that_the_next_one_does_not_clean(mnist_dir, tmp_path, sig):
    out = tmp_path / "recs"
    args = [sys.executable, "-m", "mnistflow", "prep", "mnist", "--data", str(mnist_dir),
            "--out", str(out), "--variants", "2"]
    for _attempt in range(3):  # kill it while its temporary set exists (writing takes seconds)
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if _wait_for(lambda: any(p.name.startswith(".recs.tmp-") for p in tmp_path.iterdir())
                     or proc.poll() is not None):
            if proc.poll() is None:
                proc.send_signal(sig)
                break
        proc.wait()
    else:
        pytest.skip("prep finished before it could be killed")
    rc = proc.wait(timeout=60)
    proc.stderr.close()
    if sig == signal.SIGTERM:  # handled like Ctrl-C: the temporary set is removed at once
        assert rc == 128 + signal.SIGTERM, rc
        assert no_leftovers(tmp_path) == []
    else:  # nothing runs on SIGKILL: the set stays until the next prep sweeps it
        assert rc == -signal.SIGKILL
        assert any(n.startswith(".recs.tmp-") for n in no_leftovers(tmp_path))
    again = run_cli("prep", "mnist", "--data", str(mnist_dir), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert no_leftovers(tmp_path) == []
    assert json.loads((out / "meta.json").read_text())["splits"]["train"] == 55000


def test_d13_tampered_meta_is_one_line(mnist_records, tmp_path):
    r = Path(shutil.copytree(mnist_records, tmp_path / "r"))
    meta = json.loads((r / "meta.json").read_text())
    meta["shape"] = [32, 32, 3]
    (r / "meta.json").write_text(json.dumps(meta))
    assert_one_line_error(run_cli("records", str(r)), "meta.json", "checksum does not match")
    proc = run_cli("train", "--recipe", "softmax", "--data", str(r), "--max-steps", "1")
    assert_one_line_error(proc, "meta.json", "prep --force")  # was a RuntimeError traceback


def test_d13_inconsistent_files_are_one_line(mnist_records, tmp_path):
    from mnistflow.core.fsutil import sha256_file
    from mnistflow.data.records import meta_checksum

    r = Path(shutil.copytree(mnist_records, tmp_path / "r"))
    y = np.load(r / "train_y.npy")[:5]  # 5 labels for 55,000 images, its checksum updated
    np.save(r / "train_y.npy", y)
    meta = json.loads((r / "meta.json").read_text())
    meta["files"]["train_y.npy"] = sha256_file(r / "train_y.npy")
    meta["meta_sha256"] = meta_checksum(meta)
    (r / "meta.json").write_text(json.dumps(meta))
    assert_one_line_error(run_cli("records", str(r)), "train_y.npy", "(5,)", "(55000,)")
    proc = run_cli("train", "--recipe", "softmax", "--data", str(r), "--max-steps", "1")
    assert_one_line_error(proc, "train_y.npy", "inconsistent")  # was rc 0 after one step on 5


def test_d14_idx_size_product_that_wraps_int64_is_one_line(tmp_path):
    src = tmp_path / "wrap"
    src.mkdir()
    idx_gz(src / "train-images-idx3-ubyte.gz", (65536,) * 4, b"")
    idx_gz(src / "train-labels-idx1-ubyte.gz", (1,), b"\0")
    proc = run_cli("prep", "--data", str(src), "--out", str(tmp_path / "wo"))
    assert_one_line_error(proc, "train-images-idx3-ubyte.gz", "(65536, 65536, 65536, 65536)")


def test_d15_a_fifo_in_an_image_folder_does_not_hang_prep(tmp_path):
    from PIL import Image

    for c in "01":
        (tmp_path / "ff" / c).mkdir(parents=True)
        Image.fromarray(np.full((8, 8), 9, np.uint8)).save(tmp_path / "ff" / c / "a.png")
    os.mkfifo(tmp_path / "ff" / "1" / "pipe.png")
    proc = run_cli("prep", "--data", str(tmp_path / "ff"), "--out", str(tmp_path / "ffo"),
                   "--val-size", "1", timeout=60)  # was: hung until killed
    assert_one_line_error(proc, "pipe.png", "not a regular file")
    os.mkfifo(tmp_path / "train-images-idx3-ubyte")
    proc = run_cli("prep", "--data", str(tmp_path / "train-images-idx3-ubyte"), "--out",
                   str(tmp_path / "x"), timeout=60)
    assert_one_line_error(proc, "train-images-idx3-ubyte", "not a regular file")
