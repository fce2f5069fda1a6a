"""``mnistflow train --help``: grouped, generated from TrainConfig's field metadata, and showing
the values of ``--recipe`` as the defaults. Built in-process; nothing is trained."""
from __future__ import annotations

import re
import sys
import types
from dataclasses import fields

import pytest

from mnistflow import cli
from mnistflow.training.config import GROUPS, TrainConfig
from mnistflow.training.recipes import RECIPES


def help_of(argv: list[str], capsys) -> str:
    """What ``mnistflow ARGV`` prints (ARGV ends with --help), through the real entry point."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def sections(text: str) -> dict[str, str]:
    """The help text cut at its section titles ('data:', 'optimization:', ...)."""
    parts = re.split(r"^(\S[^\n]*):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def flag_help(text: str, flag: str) -> str:
    """The help of one option, its wrapped lines joined."""
    m = re.search(rf"^  {re.escape(flag)}\b.*?(?=^  -|^\S|\Z)", text, flags=re.M | re.S)
    assert m, f"{flag} not in the help"
    return " ".join(m.group(0).split())


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_every_field_declares_its_help_and_group():
    for f in fields(TrainConfig):
        assert f.metadata.get("help", "").strip(), f"{f.name}: no help text"
        assert f.metadata.get("group") in GROUPS, f"{f.name}: group {f.metadata.get('group')!r}"
    used = {f.metadata["group"] for f in fields(TrainConfig)}
    assert used == set(GROUPS), f"groups without a field: {set(GROUPS) - used}"


def test_the_recipe_help_names_every_recipe():
    recipe = next(f for f in fields(TrainConfig) if f.name == "recipe")
    for name in RECIPES:
        assert name in recipe.metadata["help"], name


@pytest.mark.parametrize("verb", ["train", "profile"])
def test_help_is_grouped_by_the_field_metadata(verb, capsys):
    text = help_of([verb, "--help"], capsys)
    got = sections(text)
    assert list(got) == list(GROUPS), list(got)  # every section, in order, and no other
    for f in fields(TrainConfig):
        group = f.metadata["group"]
        assert re.search(rf"^  {re.escape(flag(f.name))}\b", got[group], re.M), (f.name, group)
        assert f.metadata["help"].split()[0] in flag_help(got[group], flag(f.name))
        for other in set(GROUPS) - {group}:
            assert not re.search(rf"^  {re.escape(flag(f.name))}\b", got[other], re.M), (f.name, other)
    for extra in ("-h, --help", "--config", "--nproc", "--max-restarts"):  # the flags that are not settings
        assert re.search(rf"^  {re.escape(extra)}\b", got["run"], re.M), extra


def test_help_shows_the_field_defaults_without_a_recipe(capsys):
    text = help_of(["train", "--help"], capsys)
    for f in fields(TrainConfig):
        shown = flag_help(text, flag(f.name))
        if f.default is None:  # not given means "decided at run time": the help text says how, if at all
            assert "(default: None)" not in shown, shown
        else:
            assert shown.endswith(f"(default: {f.default})"), shown
    assert "The defaults shown are those of --recipe" not in text


@pytest.mark.parametrize("name", list(RECIPES))
def test_help_after_a_recipe_shows_its_values_as_defaults(name, capsys):
    text = help_of(["train", "--recipe", name, "--help"], capsys)
    assert f"The defaults shown are those of --recipe {name}" in text
    for key, value in RECIPES[name].items():
        assert flag_help(text, flag(key)).endswith(f"(default: {value})"), (key, value)
    assert flag_help(text, "--recipe").endswith(f"(default: {name})")
    untouched = next(f for f in fields(TrainConfig) if f.name not in RECIPES[name] and f.default is not None)
    assert flag_help(text, flag(untouched.name)).endswith(f"(default: {untouched.default})")


def test_fast_recipe_help_example(capsys):
    # the example: `mnistflow train --recipe fast --help` shows 0.45 for --epochs
    assert "(default: 0.45)" in flag_help(help_of(["train", "--recipe", "fast", "--help"], capsys), "--epochs")


@pytest.mark.parametrize("argv", [["train", "--recipe=best", "--help"], ["train", "--rec", "best", "--help"],
                                  ["train", "--recipe", "fast", "--recipe", "best", "--help"]])
def test_the_recipe_is_read_as_argparse_reads_it(argv, capsys):
    assert flag_help(help_of(argv, capsys), "--epochs").endswith("(default: 7)")


def test_an_unknown_recipe_leaves_the_help_alone(capsys):
    text = help_of(["train", "--recipe", "nope", "--help"], capsys)
    assert flag_help(text, "--epochs").endswith("(default: 1.0)")
    assert "The defaults shown" not in text


def test_profile_help_shows_the_profile_defaults(capsys):
    text = help_of(["profile", "--recipe", "fast", "--help"], capsys)
    assert flag_help(text, "--profile-steps").endswith("(default: 5:15)")
    assert flag_help(text, "--tensorboard").endswith("(default: False)")
    assert flag_help(text, "--epochs").endswith("(default: 0.45)")


def test_flags_stay_unset_until_given():
    """The help shows the recipe's values, but the parsed flags stay None ('not given'), so a
    --config file still overrides the recipe and only given flags override it."""
    argv = ["train", "--recipe", "fast"]
    a = cli.build_parser(argv).parse_args(argv)
    assert a.recipe == "fast"
    assert all(getattr(a, f.name) is None for f in fields(TrainConfig) if f.name != "recipe")


@pytest.mark.parametrize("argv, name, value", [
    (["--batch-size", "auto"], "batch_size", "auto"),
    (["--batch-size", "64"], "batch_size", 64),
    (["--epochs", "0.5"], "epochs", 0.5),
    (["--max-steps", "7"], "max_steps", 7),
    (["--no-validate"], "validate", False),
    (["--augment"], "augment", "auto"),
    (["--no-augment"], "augment", "off"),
    (["--augment", "photos"], "augment", "photos"),
    (["--resume"], "resume", "latest"),
    (["--resume", "runs/x"], "resume", "runs/x"),
    (["--train-on", "train+val"], "train_on", "train+val"),
    (["--memory-cap-mb", "512"], "memory_cap_mb", 512.0),
])
def test_flags_parse_to_the_field_types(argv, name, value):
    full = ["train", *argv]
    got = getattr(cli.build_parser(full).parse_args(full), name)
    assert got == value and type(got) is type(value)


def test_a_bad_value_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--batch-size", "many"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mnistflow: error: ") and "--batch-size" in err[0]


def test_other_verbs_do_not_build_the_training_flags():
    # `mnistflow --help` and the other verbs stay fast: train's ~60 flags are built only for it
    sub = next(a for a in cli.build_parser(["models"])._actions if a.dest == "verb")
    assert not any(a.option_strings for a in sub.choices["train"]._actions if a.dest != "help")
    full = next(a for a in cli.build_parser()._actions if a.dest == "verb")
    assert any(a.dest == "lr" for a in full.choices["train"]._actions)


def test_profile_settings_stop_after_the_profiled_steps():
    assert cli._profile_settings({}) == {"profile_steps": "5:15", "tensorboard": False, "max_steps": 15}
    assert cli._profile_settings({"profile_steps": "2:4", "tensorboard": True}) == {
        "profile_steps": "2:4", "tensorboard": True, "max_steps": 4}
    assert cli._profile_settings({"max_steps": 50})["max_steps"] == 50


def test_train_and_profile_pass_only_the_given_flags(monkeypatch):
    calls = []
    api = types.ModuleType("mnistflow.training.api")  # stands in for the library: nothing trains
    api.train = lambda config=None, **kw: calls.append((config, kw)) or {}
    monkeypatch.setitem(sys.modules, "mnistflow.training.api", api)
    assert cli.main(["train", "--recipe", "fast", "--lr", "0.5", "--no-validate"]) == 0
    assert cli.main(["profile", "--profile-steps", "1:3"]) == 0
    assert calls == [(None, {"recipe": "fast", "lr": 0.5, "validate": False}),
                     (None, {"profile_steps": "1:3", "tensorboard": False, "max_steps": 3})]
