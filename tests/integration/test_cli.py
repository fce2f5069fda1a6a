"""The command line as a user meets it: fast help, python -m, argument errors, doctor."""
from __future__ import annotations

import json
import subprocess
import sys

from helpers.cli import assert_one_line_error, run_cli


def _help_in_a_fresh_process(*argv: str) -> str:
    """What ``mnistflow ARGV`` prints, then whether it imported torch (a fresh interpreter)."""
    code = ("import sys, contextlib, io\nfrom mnistflow.cli import main\n"
            "buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n"
            f"    try: main({list(argv)!r})\n"
            "    except SystemExit: pass\n"
            "print(buf.getvalue()); print('TORCH_LOADED', 'torch' in sys.modules)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_help_lists_the_verbs_without_importing_torch():
    out = _help_in_a_fresh_process("--help")
    for verb in ("prep", "records", "train", "eval", "predict", "models", "doctor"):
        assert verb in out
    assert "TORCH_LOADED False" in out  # heavy imports stay inside the handlers


def test_train_help_is_grouped_with_the_recipe_defaults_without_importing_torch():
    out = _help_in_a_fresh_process("train", "--recipe", "fast", "--help")
    for title in ("run:", "data:", "model:", "optimization:", "precision/devices:", "logging:", "checkpoints:"):
        assert f"\n{title}\n" in out, title
    assert "The defaults shown are those of --recipe fast" in out
    assert "TORCH_LOADED False" in out
    # the real entry point reads --recipe from sys.argv
    proc = run_cli("train", "--recipe=fast", "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    epochs = next(line for line in proc.stdout.splitlines() if line.lstrip().startswith("--epochs"))
    assert epochs.rstrip().endswith("(default: 0.45)"), epochs


def test_python_dash_m_and_version():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("mnistflow ")


def test_argument_errors_are_one_line():
    assert_one_line_error(run_cli("train", "--epochs", "many"), "--epochs")
    assert_one_line_error(run_cli("frobnicate"), "frobnicate")
    assert_one_line_error(run_cli("prep", "--resize", "28by28"), "HxW")


def test_doctor_reports_the_machine():
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["torch"].startswith("2.") and d["cores"] >= 1 and d["recommendations"]
    from mnistflow.runtime.cpu import cpu_has_fast_bf16

    fast_bf16 = cpu_has_fast_bf16() or any(g["bf16"] for g in d["gpus"])
    # the advice names bf16 either way; whether it recommends it follows the hardware
    assert any(r.startswith("no fast bf16") for r in d["recommendations"]) == (not fast_bf16)


def test_models_lists_every_registered_model():
    from mnistflow.models import get_entry, list_models

    proc = run_cli("models")
    assert proc.returncode == 0
    builtin = [n for n in list_models() if get_entry(n).factory.__module__.startswith("mnistflow.")]
    assert len(builtin) >= 7
    for name in builtin:  # (other test modules register models of their own in this process)
        assert name in proc.stdout
    assert "3,274,634" in proc.stdout  # seed-cnn


def test_predict_on_an_idx_file_and_a_png(mnist_records, mnist_dir, tmp_path):
    from PIL import Image

    from mnistflow.data.formats.idx import read_idx
    from mnistflow.training.api import train

    train(recipe="softmax", data=mnist_records, run_dir=tmp_path / "run", quiet=True, threads=1,
          tensorboard=False)
    imgs = read_idx(mnist_dir / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz")
    Image.fromarray(255 - imgs[0]).save(tmp_path / "ink_on_paper.png")  # dark on light, like a photo
    proc = run_cli("predict", str(tmp_path / "run"), str(tmp_path / "ink_on_paper.png"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["label"] == labels[0]
    idx = tmp_path / "t10k-images-idx3-ubyte"
    idx.write_bytes(bytes([0, 0, 8, 3]) + (50).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + imgs[:50].tobytes())
    proc = run_cli("predict", str(tmp_path / "run"), str(idx), "--json")
    preds = json.loads(proc.stdout)
    assert len(preds) == 50 and sum(p["label"] == y for p, y in zip(preds, labels[:50])) >= 44
    (tmp_path / "junk.png").write_bytes(b"not a png")
    assert_one_line_error(run_cli("predict", str(tmp_path / "run"), str(tmp_path / "junk.png")), "junk.png")


def test_a_reader_that_leaves_early_is_not_an_error():
    # `mnistflow summary seed-cnn | head -1`: the pipe closes before mnistflow writes.
    proc = subprocess.Popen([sys.executable, "-m", "mnistflow", "summary", "seed-cnn"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""
