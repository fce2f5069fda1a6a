"""Evaluating a model over a loader: loss, accuracy, the confusion matrix; test-time augmentation.

Used by training (validation and the final test) and by ``mnistflow eval``. The sums stay on
the device until the end (one read), and under torchrun each rank's shard is summed over the
ranks, so every rank returns the whole split's numbers.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from mnistflow.data.augment import TTA_SHIFTS, shifted
from mnistflow.runtime import dist
from mnistflow.runtime.device import Amp



def tta_logits(model: nn.Module | Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, views: int,
               mirror: bool = False) -> torch.Tensor:
    """Log of the class probabilities averaged over ``x`` and ``views`` more views of it: the
    first ``views`` of ``TTA_SHIFTS`` (one-pixel shifts), or with ``mirror`` (data whose class
    survives a mirror: clothing, photos) the mirror image and the first ``views - 1`` shifts.
    Usable as logits for argmax and cross-entropy. (Fashion-MNIST validation, 8 views: shifts
    93.16%, mirror + 7 shifts 93.52%, none 93.12%; fast-deep, 12 epochs, seed 0.)"""
    logits = model(x)
    if not views:
        return logits
    probs = logits.float().softmax(1)
    if mirror:
        probs += model(x.flip(3)).float().softmax(1)
    for dy, dx in TTA_SHIFTS[:views - mirror]:
        probs += model(shifted(x, dy, dx)).float().softmax(1)
    return (probs / (views + 1)).log()


@torch.inference_mode()
def evaluate(model: nn.Module | Callable[[torch.Tensor], torch.Tensor],
             loader: Iterable[tuple[torch.Tensor, torch.Tensor]], amp: Amp,
             num_classes: int, *, confusion: bool = False, tta: int = 0, mirror: bool = False) -> dict:
    """Loss and accuracy over the whole loader; with ``confusion``, the confusion matrix
    (rows: true class, columns: predicted) and per-class accuracy. ``tta`` > 0: predictions
    averaged over each image and that many more views of it (``mirror``: the first is the
    mirror image; :func:`tta_logits`).

    A loader with ``world_size > 1`` is this rank's shard (``pad=False``: each image on one
    rank): the sums are all-reduced, so every rank returns the whole split's numbers.

    ``model`` may also be a plain function x -> logits (an ONNX backend runs on the CPU)."""
    module = model if isinstance(model, nn.Module) else None
    was_training = module is not None and module.training
    if module is not None:
        module.eval()
    dev = next(module.parameters()).device if module is not None else torch.device("cpu")
    loss_sum = torch.zeros((), device=dev)
    correct = torch.zeros((), dtype=torch.int64, device=dev)
    cm = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=dev) if confusion else None
    n = 0
    for xb, yb in loader:
        with amp.autocast():
            logits = tta_logits(model, xb, tta, mirror)
        loss_sum += F.cross_entropy(logits.float(), yb, reduction="sum")
        pred = logits.argmax(1)
        correct += (pred == yb).sum()
        if cm is not None:
            cm += torch.bincount(yb * num_classes + pred, minlength=num_classes * num_classes)
        n += yb.shape[0]
    if module is not None:
        module.train(was_training)
    ls = c = None
    if getattr(loader, "world_size", 1) > 1:  # before any early return: every rank takes part
        sums = torch.stack([loss_sum.double(), correct.double(),
                            torch.tensor(float(n), dtype=torch.float64, device=dev)])
        ls, c, n = dist.all_reduce_sum(sums).tolist()
        n = int(n)
        if cm is not None:
            dist.all_reduce_sum(cm)
    if n == 0:
        return {"loss": float("nan"), "acc": float("nan"), "n": 0}
    if ls is None:
        ls, c = torch.stack([loss_sum, correct.to(loss_sum.dtype)]).tolist()
    out = {"loss": ls / n, "acc": c / n, "n": n}
    if cm is not None:
        m = cm.view(num_classes, num_classes).cpu()
        out["confusion"] = m.tolist()
        out["per_class_n"] = m.sum(1).tolist()  # true images of each class
        rows = m.sum(1).clamp(min=1)
        out["per_class_acc"] = (m.diag() / rows).tolist()
    return out
