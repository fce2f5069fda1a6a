"""Your own nn.Module and a callback, trained by mnistflow; then eval and serve from the CLI.

    python examples/custom_callback.py                          # trains runs/tiny-cnn (2 epochs)
    PYTHONPATH=examples mnistflow eval runs/tiny-cnn             # accuracy, confusion matrix
    PYTHONPATH=examples mnistflow serve runs/tiny-cnn            # the draw-a-digit page
    MNISTFLOW_EXAMPLE_STEPS=30 python examples/custom_callback.py   # a quick check (the test suite)

The model class lives in a module (examples/my_models.py), not in this script: the run records
how to rebuild it (``my_models:TinyCNN`` and its arguments), and the later commands import that
module (hence PYTHONPATH). A class defined in the script itself trains all the same, with a
warning that later commands cannot rebuild it.

A callback is any object with some of the methods on_train_start, on_step_end, on_validation_end,
on_epoch_end, on_train_end. What a method returns ({name: number}) is logged to metrics.jsonl
and TensorBoard; raising mnistflow.StopTraining("why") ends the run early.
"""
import os

import mnistflow
from my_models import TinyCNN


class BestSoFar:
    """Logs the best validation accuracy so far, next to each validation."""

    def __init__(self):
        self.best = 0.0

    def on_validation_end(self, step, logs):
        if logs["split"] == "val":                # (not a pass over the test split)
            self.best = max(self.best, logs["val_acc"])
            return {"best_val_acc": self.best}


steps = int(os.environ.get("MNISTFLOW_EXAMPLE_STEPS", 0)) or None  # None: 2 epochs

records = mnistflow.prepare("mnist", out="data/mnist")
summary = mnistflow.train(
    TinyCNN, records, model_kwargs={"width": 16}, run_dir="runs/tiny-cnn",
    epochs=2, max_steps=steps, batch_size=128, optimizer="adamw", lr=3e-3, schedule="onecycle",
    eval_every=200, quiet=True,
    callbacks=[BestSoFar(), mnistflow.EarlyStopping("val_acc", patience=3),
               mnistflow.CSVLogger("runs/tiny-cnn/log.csv")])
print(f"TinyCNN: {summary['steps']} steps in {summary['wall_s']:.1f} s (stopped by: {summary['stop_reason']}), "
      f"test accuracy {100 * summary['test_acc']:.2f}% (about 98.7% after 2 epochs)")
print("next: PYTHONPATH=examples mnistflow eval runs/tiny-cnn")
