"""The lists of choices that several layers share: the config and the CLI read them here, and so
do the runtime, the models and the data that act on them. Torch-free, so that ``--help`` and the
config never import torch to know what is allowed."""
from __future__ import annotations

PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # auto: bf16 where the hardware is fast at it
OPTIMIZERS = ("sgd", "momentum", "adadelta", "adagrad", "adam", "adamw", "rmsprop", "muon")
SCHEDULES = ("constant", "step", "cosine", "onecycle", "linear")
# --augment: auto (the dataset's own policy), off, or a policy of data.augment (keyed by these names)
AUGMENT = ("auto", "off", "glyphs", "elastic", "clothing", "photos", "shifts")
EXPORT_FORMATS = ("onnx", "pt2", "npz", "safetensors", "web")  # mnistflow export --format (exporting)
PREDICT_FORMATS = ("table", "json", "jsonl", "csv")  # mnistflow predict --format (inference)
TTA_VIEWS = (0, 2, 4, 8)  # extra views: left/right, + up/down, + the diagonals (models.evaluate)
