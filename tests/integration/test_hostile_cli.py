"""HOSTILE-INPUTS.md D12 as a user meets it: a bad flag, TOML value or environment variable is
one line ``mnistflow: error: ...`` with exit 2, before any work starts (no records prepared into
the cache, no run directory), and ``models`` counts any input size in bounded memory."""
from __future__ import annotations

import pytest

from helpers.cli import assert_one_line_error, run_cli


@pytest.mark.parametrize("flags, env, message", [
    (["--epochs", "nan"], {}, "--epochs must be a finite number, got nan"),
    (["--epochs", "inf"], {}, "--epochs must be a finite number, got inf"),
    (["--warmup", "nan"], {}, "--warmup must be a finite number, got nan"),
    (["--weight-decay", "-1"], {}, "--weight-decay must be in [0, 1000], got -1.0"),
    (["--seed", str(2**70)], {}, "--seed must be an integer in [0, 4294967295]"),
    (["--momentum", "nan"], {}, "--momentum must be a finite number, got nan"),
    ([], {"MNISTFLOW_THREADS": "abc"}, "MNISTFLOW_THREADS must be an integer from 1 to 1024 (or unset), "
                                       "got 'abc'"),
    ([], {"MNISTFLOW_THREADS": "-3"}, "MNISTFLOW_THREADS must be an integer from 1 to 1024 (or unset), "
                                      "got '-3'"),
])
def test_train_refuses_bad_values_before_any_work(mnist_dir, tmp_path, flags, env, message):
    home, run = tmp_path / "home", tmp_path / "run"
    proc = run_cli("train", "--recipe", "softmax", "--data", str(mnist_dir), "--run-dir", str(run), *flags,
                   env={"MNISTFLOW_HOME": str(home), **env})
    assert_one_line_error(proc, message)
    assert not run.exists() and not home.exists()  # nothing prepared, nothing written


@pytest.mark.parametrize("content, message", [
    (b'recipe = "softmax"\nepochs = "abc"\n', "c.toml: epochs must be a number, got 'abc'"),
    (b'recipe = "softmax"\naugment = "false"\n', "c.toml: augment must be one of auto, off, glyphs, elastic, clothing, photos, shifts, got 'false'"),
    (b'recipe = "softmax"\n# \xff\xfe\n', "c.toml: not UTF-8 text"),
])
def test_a_bad_config_file_is_one_line(tmp_path, content, message):
    (tmp_path / "c.toml").write_bytes(content)
    assert_one_line_error(run_cli("train", "--config", str(tmp_path / "c.toml"), cwd=tmp_path), message)
    assert not (tmp_path / "runs").exists()


def test_nproc_reports_a_bad_setting_once_without_starting_processes(tmp_path):
    proc = run_cli("train", "--nproc", "2", "--recipe", "softmax", "--epochs", "nan", "--run-dir",
                   str(tmp_path / "run"))
    assert_one_line_error(proc, "--epochs must be a finite number, got nan")
    assert "torchrun" not in proc.stderr.lower() and not (tmp_path / "run").exists()


def test_models_refuses_impossible_sizes_and_counts_huge_ones_without_allocating():
    assert_one_line_error(run_cli("models", "--channels", "-1"),
                          "argument --channels: expected an integer from 1 to 64, got '-1'")
    # seed-cnn on 4096x4096 inputs holds ~69 billion weights (275 GB in fp32): counted on the
    # meta device, the listing succeeds in the memory of a normal one
    proc = run_cli("models", "--input", "4096x4096")
    assert proc.returncode == 0, proc.stderr
    seed_cnn = next(line for line in proc.stdout.splitlines() if line.startswith("seed-cnn"))
    assert "68,719,540,106" in seed_cnn, seed_cnn


def test_max_pixels_reaches_the_picture_readers(tmp_path):
    """``--max-pixels`` is the CLI's handle on the pixel cap: a picture over it is one line."""
    import numpy as np
    from PIL import Image

    for k in ("a", "b"):
        (tmp_path / "pics" / k).mkdir(parents=True)
        Image.fromarray(np.full((40, 40), 200, np.uint8)).save(tmp_path / "pics" / k / "0.png")
    out = tmp_path / "rec"
    proc = run_cli("prep", "--data", str(tmp_path / "pics"), "--out", str(out), "--val-size", "0",
                   "--max-pixels", "1000")
    assert_one_line_error(proc, "pixels")
    assert not out.exists()
    ok = run_cli("prep", "--data", str(tmp_path / "pics"), "--out", str(out), "--val-size", "0",
                 "--max-pixels", "1600")
    assert ok.returncode == 0, ok.stderr
    assert_one_line_error(run_cli("serve", "x", "--max-pixels", "0"), "--max-pixels")
