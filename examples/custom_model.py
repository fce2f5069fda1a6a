"""Register your own model and train it like the built-in ones.

    python examples/custom_model.py
    MNISTFLOW_EXAMPLE_STEPS=30 python examples/custom_model.py   # a quick check (the test suite)

A model is a factory taking ``in_shape=(C, H, W)`` and ``num_classes`` and returning an
``nn.Module`` that maps a batch (N, C, H, W) of normalized images to (N, num_classes) logits.
``@mnistflow.register_model`` files it under its function name ('_' -> '-'), so every part of
mnistflow — train, evaluate, summarize, export — finds it by that name in this process. (The
``mnistflow`` command knows only the built-in models; or describe a model as a spec string:
``mnistflow train --model "conv3x3x16-bn-relu,maxpool2,fc10"``.)
"""
import os

import torch.nn as nn

import mnistflow


@mnistflow.register_model
def wide_mlp(in_shape=(1, 28, 28), num_classes: int = 10, width: int = 256) -> nn.Module:
    """Two hidden layers with batch norm: a multi-layer perceptron between softmax and the CNN."""
    c, h, w = in_shape
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(c * h * w, width, bias=False), nn.BatchNorm1d(width), nn.ReLU(),
        nn.Linear(width, width, bias=False), nn.BatchNorm1d(width), nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(width, num_classes),
    )


steps = int(os.environ.get("MNISTFLOW_EXAMPLE_STEPS", 0)) or None  # None: 2 epochs

print(mnistflow.list_models())  # 'wide-mlp' is among them now
print(mnistflow.summarize("wide-mlp"))

records = mnistflow.prepare("mnist", out="data/mnist")
summary = mnistflow.train(model="wide-mlp", data=records, epochs=2, max_steps=steps, batch_size=128,
                          optimizer="adamw", lr=3e-3, schedule="onecycle", warmup=0.1, quiet=True)
result = mnistflow.evaluate(summary["run_dir"], "test")  # rebuilt by name from the registry
print(f"wide-mlp: {summary['steps']} steps in {summary['wall_s']:.1f} s, "
      f"test accuracy {100 * result['acc']:.2f}% (about 98% after 2 epochs)")
