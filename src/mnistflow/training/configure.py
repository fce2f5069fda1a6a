"""The configuration of ``mnistflow train [--config FILE] --flag value ...``: what the user gave,
with the facts that only files and the machine know, merged by the pure ``config.resolve``.

    defaults < a resumed run's own settings < recipe < --config file < flags

The facts gathered here: the TOML file; for ``--target-acc`` without a recipe, the cheapest
recipe measured to reach it on this kind of machine; what the recipe changes for this dataset
(``recipes.FOR_DATA``); and for ``--resume``, the checkpoint, read once and handed to ``fit``.
"""
from __future__ import annotations

import os

from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.log import note
from mnistflow.data.open import known_name, policy_of
from mnistflow.runtime import dist
from mnistflow.runtime.cpu import env_threads
from mnistflow.runtime.device import machine_kind
from mnistflow.training import config as configmod
from mnistflow.training import resume as resumemod
from mnistflow.training.config import TrainConfig
from mnistflow.training.recipes import FOR_DATA, for_data, get_recipe, pick_for_target
from mnistflow.training.resume import Resume

PATHS = ("data", "run_dir", "resume", "init_from")  # settings a caller may give as paths


def configure(config: str | os.PathLike | None = None, **flags) -> tuple[TrainConfig, Resume | None]:
    """(the configuration, the checkpoint it resumes from or None) of these settings: ``config``
    a TOML file (e.g. ``RUN/config.toml``), ``flags`` TrainConfig fields (None: not given)."""
    if config is not None and not isinstance(config, (str, os.PathLike)):
        raise MnistflowError(f"config is the path of a TOML file (e.g. RUN/config.toml); got a "
                             f"{type(config).__name__}: give settings as keyword arguments (epochs=2)")
    file = configmod.load_toml(config) if config else {}
    flags = {k: str(v) if k in PATHS and isinstance(v, os.PathLike) else v for k, v in flags.items()}
    if flags.get("resume") is True:
        flags["resume"] = "latest"
    _continue_a_restarted_job(flags)

    def given(key: str):
        return flags[key] if flags.get(key) is not None else file.get(key)

    name = given("recipe")
    if name is None and given("target_acc") is not None and not given("model") and not given("resume"):
        name = _recipe_for_target(given, file, flags)
    recipe = get_recipe(name) if name else None
    if recipe is not None and FOR_DATA.get(name):  # the recipe's own choices for this data
        policy = policy_of(given("dataset"), given("data"))
        recipe.update(for_data(name, policy) if policy else {})
    base, resume = None, None
    if given("resume"):
        base, resume = _resumed(given, flags)
    return configmod.resolve(recipe, file, flags, base=base), resume


def _continue_a_restarted_job(flags: dict) -> None:
    """Under torchrun, a restart of this job (a process died, a machine left or joined):
    ``--resume`` of the run it trains, whatever the command line says (the same command as
    its first start: a new run, or the resume of an older checkpoint)."""
    run_dir = resumemod.restarted_run()
    if run_dir is None:
        return
    flags.update(resume="latest", run_dir=str(run_dir))
    if dist.env_info().is_primary and not (flags.get("quiet") or flags.get("json")):
        note(f"torchrun restarted this job: it continues its run {display(run_dir)} from the newest "
             "checkpoint")


def _recipe_for_target(given, file: dict, flags: dict) -> str:
    """``--target-acc`` without a recipe or model: the cheapest recipe measured to reach it on
    this dataset and kind of machine (an error if none is); said in a note. Sets ``flags``'
    recipe, and a target judged on test when that recipe makes no validation pass."""
    configmod.check_value("target_acc", given("target_acc"))
    name, why = pick_for_target(given("target_acc"), known_name(given("dataset"), given("data")),
                                machine_kind(str(given("device") or "auto")))
    flags["recipe"] = name
    planned = configmod.merge(get_recipe(name), file, flags)
    if given("target_split") is None and (planned.get("train_on") == "train+val"
                                          or planned.get("validate") is False):
        flags["target_split"] = "test"  # no validation pass: the final test pass judges it
    if dist.env_info().is_primary and not (given("quiet") or given("json")):
        note(why)
    return name


def _resumed(given, flags: dict) -> tuple[dict | None, Resume | None]:
    """``--resume``: (the base layer of settings, the checkpoint). The base is the checkpoint's
    configuration; without a checkpoint (killed before its first), the run's own config.toml
    (never the defaults: that would train another model into it). Sets ``flags``' run directory
    and the checkpoint it continues from (not a newer one saved since)."""
    # the run's own quiet is not known before its config is: only an explicit one silences what
    # is said here (corrupt checkpoints skipped on the way to the newest valid one)
    path, run_dir = resumemod.locate_resume(given("resume"), given("run_dir"),
                                            quiet=bool(given("quiet") or given("json")))
    flags["run_dir"] = given("run_dir") or str(run_dir)
    # the run's own thread count (the bits depend on it), unless one is chosen now
    keep_threads = env_threads() is None and given("threads") is None
    known = set(configmod.FIELDS)
    if path is None:
        own = resumemod.restart_config(run_dir)
        return (resumemod.restart_base(own, known, keep_threads=keep_threads) if own else None), None
    resume = Resume.load(path)
    flags["resume"] = str(path)
    base = resume.config_base(known, keep_threads=keep_threads)
    return _with_own_config(resume, run_dir, base, quiet=bool(given("quiet") or given("json"))), resume


def _with_own_config(resume: Resume, run_dir, base: dict, quiet: bool) -> dict:
    """The base of a resume from one of the run's own checkpoints, with what its config.toml
    changes (an edit since the checkpoint, or a resume with other flags killed before its
    first checkpoint): honoured and said in a note, never silently written back; a change of
    the model or data (RESUME_IDENTITY) is an error naming the key. A checkpoint of another
    run is refused first (``check_same_run``)."""
    from mnistflow.artifacts.rundir import RunDir

    own, of = RunDir(run_dir).config, RunDir.of_checkpoint(resume.path)
    if of is None or not own.is_file() or os.path.realpath(of.path) != os.path.realpath(run_dir):
        return base
    resumemod.check_same_run(resume, run_dir)
    edits = resumemod.config_edits(resume, configmod.load_toml(own))
    fixed = [k for k in resumemod.RESUME_IDENTITY if k in edits]
    if fixed:
        k = fixed[0]
        raise MnistflowError(f"{k} = {edits[k][1]!r} here, but the checkpoint's run has {edits[k][0]!r}: a "
                             "resume cannot change the model or data; put it back, or train a new run "
                             "with --config", own)
    if edits and not quiet and dist.env_info().is_primary:
        note(f"{own}: resuming with its " + ", ".join(f"{k} = {new!r} (the checkpoint's: {old!r})"
                                                       for k, (old, new) in edits.items()))
    return {**base, **{k: new for k, (_, new) in edits.items()}}
