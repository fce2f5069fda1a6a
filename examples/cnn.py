"""Chapter 4 of docs/tutorial.md through the Python API: the tutorial's deep CNN (~99.2%).

    python examples/cnn.py                                  # 4 epochs: minutes on a CPU, seconds on a GPU
    MNISTFLOW_EXAMPLE_STEPS=20 python examples/cnn.py       # a quick check (the test suite does this)

conv5x5-32 -> max pool -> conv5x5-64 -> max pool -> fc1024 -> dropout 0.5 -> fc10, trained with
Adam and a one-cycle learning rate (the ``seed-cnn`` recipe), in bfloat16 where the CPU or GPU
is fast at it. ``mnistflow report RUN_DIR`` then draws its curves and mistakes.
"""
import os

import mnistflow

steps = int(os.environ.get("MNISTFLOW_EXAMPLE_STEPS", 0)) or None  # None: the recipe's 4 epochs

# Each layer and the shape of its output for one 28x28 image.
print(mnistflow.summarize("seed-cnn"))

records = mnistflow.prepare("mnist", out="data/mnist")
summary = mnistflow.train(recipe="seed-cnn", data=records, max_steps=steps, quiet=True)
print(f"\ntrained {summary['steps']} steps ({summary['epochs']} epochs) in {summary['wall_s']:.1f} s, "
      f"{summary['img_per_s']:,.0f} img/s on {summary['device']} {summary['precision']}, "
      f"{100 * summary['data_wait_frac']:.1f}% of the time waiting for data")

result = mnistflow.evaluate(summary["run_dir"], "test")
print(f"test accuracy {100 * result['acc']:.2f}% (the tutorial: about 99.2% after 4 epochs)")
worst = min(range(10), key=lambda k: result["per_class_acc"][k])
print(f"hardest digit: {result['class_names'][worst]} ({100 * result['per_class_acc'][worst]:.2f}%)")

# Dropout is active only in training: the loaded model is in eval mode, so predictions are
# deterministic. Predict the first test images straight from the records.
import numpy as np  # noqa: E402

from mnistflow.artifacts.model_file import load_model  # noqa: E402
from mnistflow.artifacts.predictor import predict_arrays  # noqa: E402

model, info = load_model(summary["run_dir"])
x, y = mnistflow.open_records(records).split("test")
probs = predict_arrays(model, info, np.array(x[:8]))
print("first test images: true", y[:8].tolist(), "predicted", probs.argmax(1).tolist(),
      "confidence", [f"{p:.2f}" for p in probs.max(1)])
