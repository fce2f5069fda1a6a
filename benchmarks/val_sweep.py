"""Choosing recipes on validation, never on test: train on the training split only, score the
validation split with test-time views, save each model's validation probabilities, and compare
models and ensembles offline from those files.

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/val_sweep.py [--data DIR] run TAG
        [--dataset mnist] [--recipe best] [--set model=fast-deep epochs=3 ...]
        [--factory MODULE:FUNCTION] [--seeds 0 1] [--views 8]
    python benchmarks/val_sweep.py compare TAG [TAG ...] [--per-seed]   # (the first TAG is the reference)
    python benchmarks/val_sweep.py time TAG [TAG ...] [--rounds 8]   # training walls, interleaved

`run` trains through the public API on records that have no test split at all (a view of the
prepared records without it), so no test figure is computed, let alone read. It writes
OUT/TAG_SEED.npy (N_val x classes probabilities) and prints each seed's validation accuracy,
errors and wall time. `--set` values are JSON where they parse as JSON (numbers, true, lists),
else strings; `--factory` trains a model function of an importable module instead of a name;
`--glyphs SHIFT DEGREES` changes the glyph augmentation's ranges for the run; `--dataset` names
what the raw data holds (its records are prepared once per dataset; `compare` and `time` take
it from the tag).
`compare` prints each model's accuracy and errors, how many of the images that every model of
the first TAG gets wrong it gets wrong too, each TAG's ensemble and the ensemble of all; with
`--per-seed`, every mixed ensemble of one model per TAG, made seed by seed.
`time` trains each TAG again as its `run` did (its settings are kept in OUT/TAG.json), in one
process, the tags interleaved round by round (seed = round, the order reversed every other
round, no scoring), and prints each tag's median training wall and its ratio to the first
TAG's: the VM's speed drifts, so times are compared only within one such run.
BENCHMARKS.md's "Narrower nets" and "What `fast`'s arithmetic allows" tables came from this
script. The other validation tables ("How `mid` was chosen", "Ensembles ...", "Other nets ...")
came from scripts that took the same steps but also ran the test pass, unread; their wall times
include it.
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

import torch  # noqa: E402

OUT = Path(os.environ.get("MNISTFLOW_SWEEP_DIR", Path(tempfile.gettempdir()) / "mnistflow-val-sweep"))


def records_without_test(full: Path, view: Path) -> Path:
    """``view``: a copy of the records ``full`` without their test split: the same train and
    val files (hard links where the file system has them) and a meta.json that lists no test
    split, its checksum made by the records' own function. Made once; returns ``view``."""
    from mnistflow.data.records import meta_checksum

    if not (view / "meta.json").exists():
        view.mkdir(parents=True, exist_ok=True)
        meta = json.loads((full / "meta.json").read_text())
        meta["splits"].pop("test", None)
        meta["files"] = {k: v for k, v in meta["files"].items() if not k.startswith("test_")}
        for name in meta["files"]:
            if not (view / name).exists():
                try:
                    os.link(full / name, view / name)
                except OSError:
                    shutil.copyfile(full / name, view / name)
        meta["meta_sha256"] = meta_checksum(meta)
        (view / "meta.json").write_text(json.dumps(meta, indent=1))
    return view


def sweep_records(data: str, dataset: str = "mnist") -> Path:
    """``dataset`` from ``data`` prepared once under OUT, and its view without the test split."""
    import mnistflow

    full = OUT / ("records" if dataset == "mnist" else f"records-{dataset}")
    if not (full / "meta.json").exists():
        mnistflow.prepare(dataset, data, full, quiet=True)
    return records_without_test(full, full.with_name(full.name + "-no-test"))


def parse_sets(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


_SHIPPED: dict = {}  # the glyphs policy as mnistflow ships it, once replaced


def _glyphs(glyphs: list[float] | None) -> None:
    """The glyphs policy with other shift / rotation ranges in this process (None: as shipped)."""
    import mnistflow.data.augment as aug

    shipped = _SHIPPED.setdefault("glyphs", aug.POLICIES["glyphs"])
    if not glyphs:
        aug.POLICIES["glyphs"] = shipped
        return
    shift, degrees = glyphs
    aug.POLICIES["glyphs"] = aug.Policy("glyphs", f"shifts {shift} px, rotations {degrees} degrees",
                                        aug._glyphs_draw,
                                        lambda x, d, fill: aug._rotate_shift(x, d[0], shift, degrees))


def _train(spec: dict, recs: Path, seed: int, run_dir: str) -> dict:
    """One training run of a tag's ``spec`` (what `run` recorded) on the records without test."""
    import mnistflow

    settings = parse_sets(spec["set"])
    if spec.get("factory"):
        module, _, name = spec["factory"].partition(":")
        settings["model"] = getattr(importlib.import_module(module), name)
    _glyphs(spec.get("glyphs"))
    return mnistflow.train(recipe=spec["recipe"], data=str(recs), seed=seed, threads=spec["threads"],
                           quiet=True, tensorboard=False, run_dir=run_dir, train_on="train",
                           validate=False, **settings)


def run(a: argparse.Namespace) -> None:
    import mnistflow
    from mnistflow.data.augment import mirror_safe
    from mnistflow.data.normalize import normalize
    from mnistflow.data.records import open_records
    from mnistflow.models.evaluate import tta_logits

    torch.set_num_threads(a.threads)
    recs = sweep_records(a.data, a.dataset)
    rec = open_records(recs)
    vx, vy = rec.split("val")
    vy = np.asarray(vy)
    mirror = mirror_safe(rec.name)  # the views a run's own test pass takes (training.loop)
    spec = {"recipe": a.recipe, "set": a.set, "factory": a.factory, "glyphs": a.glyphs, "threads": a.threads,
            "dataset": a.dataset}
    (OUT / f"{a.tag}.json").write_text(json.dumps(spec))  # what `time` trains again
    what = {**parse_sets(a.set), **({"model": a.factory} if a.factory else {}),
            **({"glyphs": a.glyphs} if a.glyphs else {})}
    print(f"# {machine()}\n# {a.tag}: {a.dataset}, recipe {a.recipe}, {what}, train only, {a.views} extra views")
    for seed in a.seeds:
        path = OUT / f"{a.tag}_{seed}.npy"
        run_dir = tempfile.mkdtemp()
        t0 = time.perf_counter()
        r = _train(spec, recs, seed, run_dir)
        model, info = mnistflow.load_any(run_dir)
        model.eval()
        x = normalize(np.asarray(vx), info.mean, info.std)
        with torch.inference_mode():  # probabilities averaged over the views (tta_logits: their log)
            p = torch.cat([tta_logits(model, x[i:i + 1000], a.views, mirror).exp()
                           for i in range(0, len(x), 1000)]).numpy()
        np.save(path, p)
        shutil.rmtree(run_dir, ignore_errors=True)
        wrong = int((p.argmax(1) != vy).sum())
        print(f"{a.tag} seed {seed}: val {100 * (1 - wrong / len(vy)):.2f}% ({wrong} errors), "
              f"training wall {r['wall_s']:.1f} s, with scoring {time.perf_counter() - t0:.1f} s", flush=True)


def time_tags(a: argparse.Namespace) -> None:
    """Each tag's training wall, the tags interleaved in this one process."""
    specs = {}
    for tag in a.tags:
        f = OUT / f"{tag}.json"
        if not f.exists():
            sys.exit(f"no settings saved for {tag} in {OUT} (run it first)")
        specs[tag] = json.loads(f.read_text())
    recs = {tag: sweep_records(a.data, spec.get("dataset", "mnist")) for tag, spec in specs.items()}
    walls: dict[str, list[float]] = {tag: [] for tag in a.tags}
    print(f"# {machine()}\n# training walls, train only, {a.rounds} interleaved rounds (seed = round)")
    for rnd in range(a.rounds):
        for tag in (a.tags if rnd % 2 == 0 else a.tags[::-1]):
            run_dir = tempfile.mkdtemp()
            walls[tag].append(_train(specs[tag], recs[tag], rnd, run_dir)["wall_s"])
            shutil.rmtree(run_dir, ignore_errors=True)
    ref = float(np.median(walls[a.tags[0]]))
    print("| tag | median training wall s | ratio | each round |\n|---|---|---|---|")
    for tag, w in walls.items():
        print(f"| {tag} | {np.median(w):.3f} | {np.median(w) / ref:.2f} | {' '.join(f'{v:.2f}' for v in w)} |")


def saved(tag: str) -> dict[int, np.ndarray]:
    """The validation probabilities ``run`` saved for ``tag``, by seed (TAG_SEED.npy; not
    another tag's that starts the same, as ``ff_0_1.npy`` does for ``ff``)."""
    seeds = {}
    for f in OUT.glob(f"{tag}_*.npy"):
        m = re.fullmatch(rf"{re.escape(tag)}_(\d+)", f.stem)
        if m:
            seeds[int(m.group(1))] = f
    return {seed: np.load(seeds[seed]) for seed in sorted(seeds)}


def compare(a: argparse.Namespace) -> None:
    from mnistflow.data.records import open_records

    first = OUT / f"{a.tags[0]}.json"  # the dataset the tags were run on
    dataset = json.loads(first.read_text()).get("dataset", "mnist") if first.exists() else "mnist"
    _, vy = open_records(sweep_records(a.data, dataset)).split("val")
    vy = np.asarray(vy)
    by_seed = {tag: saved(tag) for tag in a.tags}
    probs = {tag: list(models.values()) for tag, models in by_seed.items()}
    if not probs[a.tags[0]]:
        sys.exit(f"no saved models for {a.tags[0]} in {OUT} (run it first)")
    shared = np.logical_and.reduce([p.argmax(1) != vy for p in probs[a.tags[0]]])

    def acc(ps: list[np.ndarray]) -> str:
        return f"{100 * (sum(ps).argmax(1) == vy).mean():.2f}%"

    print(f"{int(shared.sum())} validation images are wrong in every model of {a.tags[0]}")
    for tag, ps in probs.items():
        for p in ps:
            w = p.argmax(1) != vy
            print(f"  {tag}: val {acc([p])}, {int(w.sum())} errors, {int((w & shared).sum())} of the shared")
        if len(ps) > 1:
            print(f"  {tag}: ensemble of {len(ps)}: {acc(ps)}")
    everything = [p for ps in probs.values() for p in ps]
    if len(probs) > 1:
        print(f"all {len(everything)} models: {acc(everything)}")
    if a.per_seed:
        per_seed(by_seed, vy)


def per_seed(by_seed: dict[str, dict[int, np.ndarray]], vy: np.ndarray) -> None:
    """Mixed ensembles: for every set of two or more tags, the ensemble of one model of each
    tag, made per seed (seed s of every tag), as a recipe that trains those nets together with
    one seed would give; each seed's validation accuracy and their mean."""
    print("| models (one of each tag, per seed) | val % per seed | mean |\n|---|---|---|")
    for r in range(2, len(by_seed) + 1):
        for combo in itertools.combinations(by_seed, r):
            seeds = sorted(set.intersection(*(set(by_seed[t]) for t in combo)))
            accs = [100 * (sum(by_seed[t][s] for t in combo).argmax(1) == vy).mean() for s in seeds]
            if accs:
                print(f"| {' + '.join(combo)} | {' / '.join(f'{s}: {v:.2f}' for s, v in zip(seeds, accs))} "
                      f"| {np.mean(accs):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("MNISTFLOW_DATA", "../shared/data/mnist"))
    sub = ap.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run", help="train on train only and save the validation probabilities")
    r.add_argument("tag")
    r.add_argument("--dataset", default="mnist", help="the dataset --data holds (default mnist)")
    r.add_argument("--recipe", default="best")
    r.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    r.add_argument("--factory", help="MODULE:FUNCTION returning the model (instead of --set model=)")
    r.add_argument("--glyphs", type=float, nargs=2, metavar=("SHIFT_PX", "DEGREES"),
                   help="the glyphs augmentation with these ranges (default 2 px, 10 degrees)")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    r.add_argument("--views", type=int, default=8, choices=(0, 2, 4, 8))
    r.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    c = sub.add_parser("compare", help="models and ensembles from the saved probabilities")
    c.add_argument("tags", nargs="+")
    c.add_argument("--per-seed", action="store_true",
                   help="also every mixed ensemble of one model per tag, made per seed")
    t = sub.add_parser("time", help="the tags' training walls, interleaved in one process")
    t.add_argument("tags", nargs="+")
    t.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    {"run": run, "compare": compare, "time": time_tags}[a.verb](a)


if __name__ == "__main__":
    main()
