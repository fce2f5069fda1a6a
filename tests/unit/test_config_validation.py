"""Every value a user hands ``train`` (a flag, a TOML file, the Python API, an environment
variable) is checked before any work starts, against the rule declared on its TrainConfig field
(HOSTILE-INPUTS.md D12): one line ``mnistflow: error: <what>: <why>``, exit 2, never a traceback."""
from __future__ import annotations

import re
from dataclasses import fields

import pytest

import mnistflow.models  # noqa: F401  (resolve checks model names: torch is imported at collection)
from mnistflow import cli
from mnistflow.core.errors import MnistflowError
from mnistflow.models import parameter_count
from mnistflow.runtime import cpu
from mnistflow.training import config as configmod
from mnistflow.training.config import TrainConfig, check_value, load_toml, resolve
from mnistflow.training.recipes import RECIPES


def one_line_error(capsys) -> str:
    """The stderr of a failed ``cli.main``: exactly one line, the error contract's."""
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("mnistflow: error: "), lines[0]
    return lines[0]


# --- the rules live on the fields ----------------------------------------------------------

def test_every_numeric_setting_declares_what_it_accepts():
    """A new int/float setting without a range would take nan, -1 or 2**70 silently."""
    for f in fields(TrainConfig):
        kind = f.type.removesuffix(" | None")
        rule = f.metadata["rule"]
        if kind in ("int", "float", "int | str"):
            bounded = rule.choices or rule.above is not None or rule.at_least is not None
            assert bounded, f"{f.name}: declare its range (setting(..., above=/at_least=/choices=))"


def test_defaults_and_recipes_pass_their_own_rules():
    for f in fields(TrainConfig):
        check_value(f.name, f.default)
    for name, recipe in RECIPES.items():
        for key, value in recipe.items():
            check_value(key, value, label=f"{name}: {key}")


def test_rates_and_factors_have_plain_ranges_a_run_can_use():
    """A rate or a decay factor that is accepted always fits the float32 weights it meets: the
    ranges are of meaning (a decay shrinks, a rate is at most 1000), not of float32."""
    from mnistflow.training.optim import lr_factor

    for name in ("lr", "muon_lr", "weight_decay"):
        check_value(name, configmod.MAX_RATE)
    check_value("step_gamma", 1.0)
    check_value("epochs", configmod.MAX_EPOCHS)
    assert lr_factor(9, 10, "step", steps_per_epoch=1, gamma=0.5) == 0.5 ** 9


# --- flags and the Python API (HOSTILE-INPUTS D12 and its minor findings) -------------------

@pytest.mark.parametrize("settings, message", [
    ({"epochs": float("nan")}, "--epochs must be a finite number, got nan"),
    ({"epochs": float("inf")}, "--epochs must be a finite number, got inf"),
    ({"epochs": "2"}, "--epochs must be a number, got '2'"),
    ({"warmup": float("nan")}, "--warmup must be a finite number, got nan"),
    ({"warmup": -5.0}, "--warmup must be a number >= 0, got -5.0"),
    ({"weight_decay": -1.0}, "--weight-decay must be in [0, 1000], got -1.0"),
    ({"seed": 2**70}, "--seed must be an integer in [0, 4294967295], got 1180591620717411303424"),
    ({"seed": -1}, "--seed must be an integer in [0, 4294967295], got -1"),
    ({"momentum": float("nan")}, "--momentum must be a finite number, got nan"),  # not blamed on --lr
    ({"momentum": 1.0}, "--momentum must be in [0, 1), got 1.0"),
    ({"eval_every": 0}, "--eval-every must be a positive integer, got 0"),
    ({"eval_every": -2}, "--eval-every must be a positive integer, got -2"),
    ({"step_every": 0.0}, "--step-every must be positive, got 0.0"),
    ({"step_gamma": 0.0}, "--step-gamma must be in (0, 1], got 0.0"),
    ({"checkpoint_secs": float("nan")}, "--checkpoint-secs must be a finite number, got nan"),
    ({"threads": 2000}, "--threads must be an integer in [1, 1024], got 2000"),
    ({"threads": 0}, "--threads must be an integer in [1, 1024], got 0"),
    ({"interop_threads": -1}, "--interop-threads must be an integer in [1, 1024], got -1"),
    ({"max_steps": 2**70}, "--max-steps must be at most 9223372036854775807"),
    ({"batch_size": True}, "--batch-size must be a positive integer or auto, got True"),
    ({"batch_size": 2.5}, "--batch-size must be a positive integer or auto, got 2.5"),
    ({"memory_cap_mb": float("inf")}, "--memory-cap-mb must be a finite number, got inf"),
    ({"lr": float("nan")}, "--lr must be a finite number, got nan"),
    ({"lr": 0.0}, "--lr must be in (0, 1000], got 0.0"),
    # finite, but beyond what a run can use: a rate above 1000, a "decay" that grows, epochs that overflow
    ({"lr": 1e39}, "--lr must be in (0, 1000], got 1e+39"),
    ({"muon_lr": 1e39}, "--muon-lr must be in (0, 1000], got 1e+39"),
    ({"step_gamma": 1e200}, "--step-gamma must be in (0, 1], got 1e+200"),
    ({"step_gamma": 1.5}, "--step-gamma must be in (0, 1], got 1.5"),
    ({"weight_decay": 1e300}, "--weight-decay must be in [0, 1000]"),
    ({"epochs": 1e308}, "--epochs must be in (0, 1000000], got 1e+308"),
    ({"label_smoothing": 1.0}, "--label-smoothing must be in [0, 1), got 1.0"),
    ({"augment": "false"}, "--augment must be one of auto, off, glyphs, elastic, clothing, photos, shifts, got 'false'"),
    ({"precision": "fp8"}, "--precision must be one of auto, fp32, bf16, fp16, got 'fp8'"),
    ({"run_dir": "runs/a\0b"}, "--run-dir must be text without NUL characters"),
    ({"model": 3}, "--model must be text, got 3"),
])
def test_impossible_values_are_one_clear_error(settings, message):
    with pytest.raises(MnistflowError) as e:
        resolve(flags=settings)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_huge_value_is_shown_shortened_on_one_line():
    with pytest.raises(MnistflowError) as e:
        resolve(flags={"precision": "x" * 10_000 + "\n"})
    assert len(str(e.value)) < 200 and "\n" not in str(e.value)


# --- TOML files -----------------------------------------------------------------------------

@pytest.mark.parametrize("line, message", [
    ('epochs = "abc"', "epochs must be a number, got 'abc'"),
    ('lr = "0.1"', "lr must be a number, got '0.1'"),
    ("lr = {a = 1}", "lr must be a number, got {'a': 1}"),
    ("epochs = nan", "epochs must be a finite number, got nan"),
    ("batch_size = 1.5", "batch_size must be a positive integer or auto, got 1.5"),
    ('batch_size = "big"', "batch_size must be a positive integer or auto, got 'big'"),
    ('augment = "false"', "augment must be one of auto, off, glyphs, elastic, clothing, photos, shifts, got 'false'"),
    ("validate = 1", "validate must be true or false, got 1"),
    ('tta = "8"', "tta must be an integer, got '8'"),
    ("tta = 3", "tta must be one of 0, 2, 4, 8, got 3"),
    ("seed = 1.0", "seed must be an integer, got 1.0"),
    ("threads = true", "threads must be an integer, got True"),
    ("model = 3", "model must be text, got 3"),
    ('data = ["a", "b"]', "data must be text, got ['a', 'b']"),
    ("precision = 1979-05-27", "precision must be text, got datetime.date(1979, 5, 27)"),
    ('run_dir = "a\\u0000b"', "run_dir must be text without NUL characters, got 'a\\x00b'"),
    ("keep_checkpoints = -1", "keep_checkpoints must be an integer >= 0, got -1"),
])
def test_toml_values_of_the_wrong_type_or_range_name_the_file_and_key(tmp_path, line, message):
    path = tmp_path / "c.toml"
    path.write_text(f'recipe = "softmax"\n{line}\n')
    with pytest.raises(MnistflowError) as e:
        load_toml(path)
    assert str(e.value) == f"{path}: {message}"


@pytest.mark.parametrize("content, message", [
    (b'recipe = "softmax"\nepochs = 1\n\xff\xfe\n', "not UTF-8 text (byte 30)"),
    (b"seed = " + b"9" * 5000, "not valid TOML (Exceeds the limit (4300 digits)"),
    (b"x = " + b"[" * 100_000, "not valid TOML"),
    (b"# " + b"x" * (2 << 20), "larger than 1 MiB: not a configuration file"),
])
def test_a_file_that_is_not_a_configuration_is_one_error(tmp_path, content, message):
    path = tmp_path / "c.toml"
    path.write_bytes(content)
    with pytest.raises(MnistflowError, match=r"c\.toml: ") as e:
        load_toml(path)
    assert message in str(e.value)
    with pytest.raises(MnistflowError, match="cannot read"):
        load_toml(tmp_path)  # a directory


# --- environment variables ------------------------------------------------------------------

@pytest.mark.parametrize("name, value, message", [
    ("MNISTFLOW_THREADS", "abc", "MNISTFLOW_THREADS must be an integer from 1 to 1024 (or unset), got 'abc'"),
    ("MNISTFLOW_THREADS", "-3", "MNISTFLOW_THREADS must be an integer from 1 to 1024 (or unset), got '-3'"),
    ("MNISTFLOW_THREADS", "0", "MNISTFLOW_THREADS must be an integer from 1 to 1024"),
    ("MNISTFLOW_THREADS", "1e3", "MNISTFLOW_THREADS must be an integer from 1 to 1024"),
    ("LOCAL_WORLD_SIZE", "two", "LOCAL_WORLD_SIZE must be an integer"),
    ("MNISTFLOW_MALLOC", "off", "MNISTFLOW_MALLOC must be default (or unset), got 'off'"),
    ("MNISTFLOW_DENORMALS", "flush", "MNISTFLOW_DENORMALS must be keep (or unset), got 'flush'"),
])
def test_bad_environment_values_fail_before_any_work(monkeypatch, name, value, message):
    from mnistflow.training.setup import check_run_inputs

    monkeypatch.setenv(name, value)
    with pytest.raises(MnistflowError) as e:
        check_run_inputs(resolve(flags={"model": "softmax"}))
    assert message in str(e.value)


@pytest.mark.parametrize("env, message", [
    ({"WORLD_SIZE": "x"}, "WORLD_SIZE must be an integer from 1 to 1048576 (or unset), got 'x'"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE must be an integer from 1 to 1048576 (or unset), got '0'"),
    ({"RANK": "1"}, "RANK must be an integer from 0 to 0 (or unset), got '1'"),  # a rank, no world
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK must be an integer from 0 to 1 (or unset), got '2'"),
    ({"WORLD_SIZE": "2", "RANK": "-1"}, "RANK must be an integer from 0 to 1 (or unset), got '-1'"),
    ({"LOCAL_RANK": "x"}, "LOCAL_RANK must be an integer from 0 to 0 (or unset), got 'x'"),
    ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2"}, "LOCAL_RANK must be an integer from 0 to 1"),
])
def test_a_bad_launch_environment_is_one_error_before_any_work(monkeypatch, env, message):
    from mnistflow.runtime import dist

    for name in cpu.LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from mnistflow.training.setup import check_run_inputs

    with pytest.raises(cpu.LaunchError) as e:
        check_run_inputs(resolve(flags={"model": "softmax"}))
    assert message in str(e.value)
    with pytest.raises(cpu.LaunchError):
        dist.env_info()  # (was a ValueError traceback for WORLD_SIZE=x)


def test_a_bad_launch_environment_is_said_by_every_process(monkeypatch, tmp_path, capsys):
    """Under torchrun the CLI prints an error from each machine's first process only (every
    rank raises the same one); a process's own launch variables are its own: each says so."""
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "x"}.items():
        monkeypatch.setenv(name, value)
    argv = ["train", "--recipe", "softmax", "--run-dir", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    assert "LOCAL_WORLD_SIZE must be an integer from 1" in one_line_error(capsys)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MNISTFLOW_THREADS", "x")  # the same on every rank: local rank 0 says it
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "r").exists()


def test_environment_values_that_mean_the_default(monkeypatch):
    for value in ("", "  "):  # set but empty: as unset
        monkeypatch.setenv("MNISTFLOW_THREADS", value)
        assert cpu.env_threads() is None
    monkeypatch.setenv("MNISTFLOW_THREADS", " 3 ")
    assert cpu.default_threads() == 3
    monkeypatch.delenv("MNISTFLOW_THREADS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cpu.default_threads() == max(1, cpu.usable_cores() // 2)


def test_more_threads_than_cores_is_allowed_with_a_warning(monkeypatch, caplog):
    set_to = []
    monkeypatch.setattr(cpu.torch, "set_num_threads", set_to.append)  # nothing really changes
    monkeypatch.setattr(cpu, "usable_cores", lambda: 2)
    assert cpu.set_threads(1000) == 1000
    assert set_to == [1000]
    assert "1000 threads on 2 usable core(s)" in caplog.text
    caplog.clear()
    cpu.set_threads(2)
    assert "usable core" not in caplog.text


# --- the command line, in-process -----------------------------------------------------------

@pytest.mark.parametrize("argv, fragment", [
    (["models", "--channels", "-1"], "argument --channels: expected an integer from 1 to 64, got '-1'"),
    (["summary", "seed-cnn", "--channels", "65"], "argument --channels: expected an integer from 1 to 64, got '65'"),
    (["models", "--classes", "0"], "argument --classes: expected an integer from 1 to 100000, got '0'"),
    (["models", "--input", "0x28"], "argument --input: expected HxW like 28x28 (sides 1 to 4096)"),
    (["summary", "seed-cnn", "--input", "100000x100000"], "argument --input: expected HxW"),
    (["summary", "seed-cnn", "--channels", "0"], "argument --channels: expected an integer from 1"),
    (["prep", "--val-size", "-1"], "argument --val-size: expected an integer >= 0, got '-1'"),
    (["prep", "--seed", "-1"], "argument --seed: expected an integer from 0 to 4294967295, got '-1'"),
    (["prep", "--variants", "nan"], "argument --variants: expected an integer >= 0, got 'nan'"),
    (["eval", "run", "--batch-size", "0"], "argument --batch-size: expected an integer >= 1, got '0'"),
    (["train", "--nproc", "0"], "argument --nproc: expected an integer from 1 to 1024, got '0'"),
    (["train", "--seed", "1.5"], "argument --seed: invalid int value: '1.5'"),
])
def test_flags_out_of_range_are_refused_by_the_parser(capsys, argv, fragment):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert fragment in one_line_error(capsys)


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--recipe", "softmax", "--epochs", "nan"], "--epochs must be a finite number, got nan"),
    (["train", "--recipe", "softmax", "--weight-decay", "-1"], "--weight-decay must be in [0, 1000]"),
    (["profile", "--profile-steps", "abc"], "--profile-steps must be A:B with 0 <= A < B, got 'abc'"),
    (["profile", "--profile-steps", "5"], "--profile-steps must be A:B"),
    (["train", "--recipe", "softmax", "--init-only", "conv*"], "--init-only selects what --init-from loads"),
])
def test_train_settings_fail_before_any_work(tmp_path, capsys, argv, fragment):
    run = tmp_path / "run"
    assert cli.main([*argv, "--run-dir", str(run)]) == 2
    assert fragment in one_line_error(capsys)
    assert not run.exists()


def test_nproc_checks_the_settings_before_starting_processes(monkeypatch, tmp_path, capsys):
    from mnistflow.runtime import dist

    started = []
    monkeypatch.setattr(dist, "launch_local", lambda *a: started.append(a) or 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["train", "--nproc", "2", "--recipe", "softmax", "--epochs", "nan", "--run-dir", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    assert "--epochs must be a finite number" in one_line_error(capsys)
    assert started == []  # one error here, not one from each of N processes


def test_models_counts_the_usual_inputs_on_the_cpu():
    # (inputs above META_ABOVE go to the meta device: tests/integration/test_hostile_cli.py)
    assert parameter_count("seed-cnn", (1, 28, 28), 10) == 3_274_634  # as `mnistflow models` shows


def test_the_error_line_shows_control_characters_as_escapes(tmp_path, capsys):
    """A file name may hold a newline or a terminal's escape codes: the error stays one line
    and writes them as escapes, not raw to the terminal."""
    from mnistflow.core.errors import one_line

    assert one_line("a\nb\x1b]0;x\x07 \udcff é") == "a\\nb\\x1b]0;x\\x07 \\udcff é"
    weird = tmp_path / "bad\nname\x1b[2J.png"
    assert cli.main(["records", str(weird)]) == 2
    line = one_line_error(capsys)
    assert "\x1b" not in line and "bad\\nname\\x1b[2J.png" in line
    with pytest.raises(SystemExit):
        cli.main(["train", "--seed", "1\n2"])  # the parser's own error line too
    assert "'1\\n2'" in one_line_error(capsys)


# --- devices: only those mnistflow runs on ----------------------------------------------------

@pytest.mark.parametrize("name", ["meta", "xla", "hpu", "vulkan", "lazy", "privateuseone", "cpu:3", "tpu",
                                  "cuda:x", "CPU", "x" * 5000])
def test_a_device_mnistflow_does_not_support_is_one_error(tmp_path, capsys, name):
    """PyTorch parses meta, xla, hpu... as devices; mnistflow runs on none of them (they were
    tracebacks in train, eval, predict and report)."""
    from mnistflow.runtime.device import parse_device, pick_device

    for check in (parse_device, pick_device):
        with pytest.raises(MnistflowError, match=r"unknown device .* \(use auto, cpu, cuda, cuda:N or mps\)$"):
            check(name)
    from mnistflow.training.setup import check_run_inputs

    with pytest.raises(MnistflowError, match="unknown device"):
        check_run_inputs(resolve(flags={"recipe": "softmax", "device": name}))
    run = tmp_path / "run"
    assert cli.main(["train", "--recipe", "softmax", "--device", name, "--run-dir", str(run)]) == 2
    line = one_line_error(capsys)
    assert "unknown device" in line and len(line) < 200
    assert not run.exists()


def test_the_supported_devices_pass_the_check():
    from mnistflow.runtime.device import parse_device

    assert parse_device("auto") is None
    assert [str(parse_device(n)) for n in ("cpu", "cpu:0", "cuda", "cuda:1", "mps")] == \
        ["cpu", "cpu:0", "cuda", "cuda:1", "mps"]


# --- config.toml holds any text a setting holds -------------------------------------------------

AWKWARD = ["emoji😀run", 'quote"back\\slash', "tab\tnew\nline\rcr", "\x01\x1f\x7f\x08\x0c", "é∑ \u2028 \ufeff",
           "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010fffd", "'single' '''triple'''", '"""', "\\u0041 \\U0001F600",
           "# not a comment", ""]


@pytest.mark.parametrize("text", AWKWARD)
def test_config_toml_round_trips_any_text(tmp_path, text):
    """save_toml wrote json.dumps: a non-BMP character became a surrogate pair escape
    ('\\ud83d\\ude00') that TOML refuses, so 'report' and 'train --config' of such a run failed."""
    from mnistflow.core import compat

    cfg = resolve(flags={"recipe": "softmax", "run_dir": text or None, "data": text or None,
                         "profile_steps": None})
    path = tmp_path / "config.toml"
    configmod.save_toml(cfg, path)
    raw = compat.tomllib().loads(path.read_text(encoding="utf-8"))
    assert raw.get("run_dir") == (text or None) and raw.get("data") == (text or None)
    back = load_toml(path)
    assert resolve(file=back) == cfg


def test_settings_of_every_kind_round_trip_through_config_toml(tmp_path):
    cfg = resolve(flags={"model": "pkg.mod:Net", "model_kwargs": {"w": 8, "shape": [1, 2.5], "t": {"a": "b"}},
                         "lr": 1e-05, "seed": 2**32 - 1, "json": True, "epochs": 2.5, "data": "x"})
    configmod.save_toml(cfg, tmp_path / "config.toml")
    assert resolve(file=load_toml(tmp_path / "config.toml")) == cfg


@pytest.mark.parametrize("key", ["run_dir", "data", "resume", "init_from", "init_only", "model"])
def test_text_that_is_not_utf8_is_one_error(key):
    """A path of bytes that are not UTF-8 (Python's surrogate escapes) cannot be written in
    config.toml nor read back: it was a UnicodeEncodeError traceback in the TensorBoard writer,
    and a directory that blocked the retry."""
    with pytest.raises(MnistflowError, match=rf"{configmod.flag(key)} must be valid UTF-8 text .*got 'bad\\udcffname'"):
        check_value(key, "bad\udcffname")


def test_a_run_dir_that_is_not_utf8_is_refused_before_anything_is_made(tmp_path, capsys, monkeypatch):
    import os

    monkeypatch.chdir(tmp_path)
    bad = os.fsdecode(b"bad\xffname")
    assert cli.main(["train", "--recipe", "softmax", "--run-dir", bad]) == 2
    assert "--run-dir must be valid UTF-8 text" in one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


# --- --init-from: an existing npz file, checked before the run directory is made ----------------

def test_init_from_is_checked_before_any_work(tmp_path, capsys):
    (tmp_path / "x.safetensors").write_bytes(b"")
    (tmp_path / "dir.npz").mkdir()
    for given, fragment in ((tmp_path / "nonexist.npz", "nonexist.npz: --init-from: does not exist"),
                            (tmp_path / "dir.npz", "dir.npz: --init-from: is a directory, not a file"),
                            (tmp_path / "x.safetensors", "x.safetensors: --init-from takes an npz")):
        run = tmp_path / "run"
        assert cli.main(["train", "--recipe", "softmax", "--init-from", str(given), "--run-dir", str(run)]) == 2
        assert fragment in one_line_error(capsys)
        assert not run.exists()
        # the same from a TOML file
        (tmp_path / "c.toml").write_text(f'recipe = "softmax"\ninit_from = "{given}"\n')
        assert cli.main(["train", "--config", str(tmp_path / "c.toml"), "--run-dir", str(run)]) == 2
        assert fragment in one_line_error(capsys)
        assert not run.exists()


# --- layer specs: bounded numbers, one line naming the token -----------------------------------

@pytest.mark.parametrize("spec, fragment", [
    ("conv3x3x8-s0", "the stride in 'conv3x3x8-s0' must be an integer in [1, 4096], got 0"),
    ("conv3x3x8-s99999999999999999999", "the stride in 'conv3x3x8-s99999999999999999999' must be"),
    ("fc99999999999999999999999", ("the number of units in 'fc99999999999999999999999' must be an integer "
                                   "in [1, 2147483647]")),
    ("fc0", "the number of units in 'fc0'"),
    ("conv0x0x8", "the kernel size in 'conv0x0x8'"),
    ("conv3x3x0-relu", "the number of channels in 'conv3x3x0-relu'"),
    ("conv5000x5000x8", "the kernel size in 'conv5000x5000x8' must be an integer in [1, 4096]"),
    ("maxpool0", "the pool size in 'maxpool0'"),
    ("maxpool2s0", "the pool stride in 'maxpool2s0'"),
    ("conv3x3x8,fc" + "9" * 5000, "the number of units in 'fc999"),
    ("fc2147483647,fc2147483647", "cannot build 'fc2147483647'"),
])
def test_a_spec_with_a_zero_or_absurd_number_is_one_error(tmp_path, capsys, spec, fragment, synthetic_records):
    """conv3x3x8-s0 was a ZeroDivisionError; a huge stride or width a torch traceback."""
    from mnistflow.models import create_model

    with pytest.raises(MnistflowError, match=re.escape(fragment)) as e:
        create_model(spec, (1, 28, 28), 10)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400
    if len(spec) < 200:  # (a longer argument is taken for a file name by summary)
        assert cli.main(["summary", spec]) == 2
        assert fragment in one_line_error(capsys)
    run = tmp_path / "run"
    assert cli.main(["train", "--model", spec, "--data", str(synthetic_records), "--run-dir", str(run)]) == 2
    assert fragment in one_line_error(capsys)
    assert not run.exists()


def test_strides_and_sizes_within_the_bounds_build():
    from mnistflow.models import create_model

    for spec in ("conv3x3x8-s2,fc10", "conv3x3x8-s4096", "conv1x1x1-s1-valid,maxpool3s1,fc10"):
        create_model(spec, (1, 28, 28), 10)


def test_nested_recordings_of_equal_warnings_each_end_their_own():
    """Ending a recording took the first EQUAL list off the stack (list.remove): with two
    recordings that held the same warnings the outer one ended, and the inner one's end then
    failed with 'x not in list'."""
    from mnistflow.core import log

    with log.recording() as outer:
        log.warn("memory nearly exhausted")
        with log.recording() as inner:
            outer.clear()
            log.warn("w")  # into both: the two lists are now equal
        assert inner == ["w"]
        log.warn("after")
    assert outer == ["w", "after"] and log._records == []


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_classes=-1), "num_classes must be an integer from 1 to 100000, got -1"),  # (a torch RuntimeError)
    (dict(num_classes=0), "num_classes must be an integer from 1 to 100000, got 0"),  # (built a model)
    (dict(num_classes=2.5), "num_classes must be an integer from 1 to 100000, got 2.5"),
    (dict(in_shape=(1, 0, 28)), "in_shape must be (channels, height, width), positive integers, got (1, 0, 28)"),
    (dict(in_shape=(28, 28)), "in_shape must be (channels, height, width)"),
])
def test_create_model_checks_its_shape_arguments(kwargs, message):
    from mnistflow.models import create_model

    for name in ("fast", "fc10"):  # a registered name and a layer spec
        with pytest.raises(MnistflowError, match=re.escape(message)):
            create_model(name, **kwargs)


@pytest.mark.parametrize("verb", ["predict", "export"])
def test_predict_and_export_read_mnistflow_threads_as_eval_and_train_do(monkeypatch, tmp_path, capsys, verb):
    """MNISTFLOW_THREADS=abc was refused by train and eval but ignored by predict and export."""
    monkeypatch.setenv("MNISTFLOW_THREADS", "abc")
    argv = [verb, str(tmp_path / "run"), *(["x.png"] if verb == "predict" else ["--format", "npz"])]
    assert cli.main(argv) == 2
    assert "MNISTFLOW_THREADS must be an integer from 1 to 1024 (or unset), got 'abc'" in one_line_error(capsys)


# --- a mistyped or foreign name gets the setting it most likely means --------------------------

def test_unknown_flags_and_keys_name_the_setting_they_likely_mean(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--learning-rate", "0.1", "--bacth-size", "64", "--no-such-thing"])
    assert e.value.code == 2
    line = one_line_error(capsys)
    assert "unrecognized arguments: --learning-rate 0.1 --bacth-size 64 --no-such-thing" in line
    assert "(did you mean: --learning-rate -> --lr, --bacth-size -> --batch-size?)" in line
    cfg = tmp_path / "c.toml"
    cfg.write_text("max_epochs = 3\nbatchsize = 64\nzzz = 1\n")
    with pytest.raises(MnistflowError) as e:
        load_toml(cfg)
    assert str(e.value) == (f"{cfg}: unknown configuration key(s): batchsize, max_epochs, zzz "
                            "(did you mean: batchsize -> batch_size, max_epochs -> epochs?)")
