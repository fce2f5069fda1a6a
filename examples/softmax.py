"""Chapter 3 of docs/tutorial.md through the Python API: softmax regression on MNIST (~92%).

    python examples/softmax.py                              # one epoch: about a second of training
    MNISTFLOW_EXAMPLE_STEPS=50 python examples/softmax.py   # a quick check (the test suite does this)

The model is y = softmax(W x + b): 784 pixels in, 10 probabilities out, 7,850 parameters,
trained by plain gradient descent on the cross-entropy. MNIST comes from $MNISTFLOW_DATA, the
cache, or a verified download, and is prepared once into records in data/mnist.
"""
import os

import mnistflow

steps = int(os.environ.get("MNISTFLOW_EXAMPLE_STEPS", 0)) or None  # None: the whole epoch

records = mnistflow.prepare("mnist", out="data/mnist")  # once; later calls find it up to date
summary = mnistflow.train(recipe="softmax", data=records, max_steps=steps, quiet=True)
print(f"trained {summary['steps']} steps in {summary['wall_s']:.2f} s "
      f"({summary['img_per_s']:,.0f} img/s) -> {summary['run_dir']}")

result = mnistflow.evaluate(summary["run_dir"], "test")
print(f"test accuracy {100 * result['acc']:.2f}% on {result['n']:,} images (the tutorial: about 92%)")
for name, acc in zip(result["class_names"], result["per_class_acc"]):
    print(f"  digit {name}: {100 * acc:6.2f}%")

# The confusion matrix (rows: true digit, columns: predicted): its largest off-diagonal cell
# is the pair of digits the linear model mixes up most.
cm = result["confusion"]
t, p = max(((i, j) for i in range(10) for j in range(10) if i != j), key=lambda ij: cm[ij[0]][ij[1]])
print(f"most confused: {cm[t][p]} images of {t} taken for {p}")
