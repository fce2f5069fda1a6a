"""A small ensemble trained as one model: ``NAME-xK`` is K independently initialised copies of
model NAME (``fast-wide-x4``: four fast-wide nets).

Training: the forward returns every member's logits, (N, K, classes), and the training step
sums the members' own losses (``member_loss``), so each member learns as if alone (a loss on
the averaged output would train one big co-adapted net, which ensembles less well); they see
the same batches and differ by their initialisation. Evaluation: the forward returns the log of
the members' averaged class probabilities, (N, classes), usable as logits everywhere a single
model's are (argmax, cross-entropy, test-time augmentation, ONNX export, serving).

One model, one run: one run directory, checkpoint, resume, export. A step costs K members'
steps but pays the data pipeline and the per-step overhead once.
"""
from __future__ import annotations

import re
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

MAX_MEMBERS = 16
_NAME = re.compile(r"^(?P<member>.+)-x(?P<k>\d{1,4})$")  # a longer K is no ensemble name


def parse_name(name: str) -> tuple[str, int] | None:
    """(member model, K) for ``NAME-xK``, else None."""
    m = _NAME.match(name)
    return (m.group("member"), int(m.group("k"))) if m else None


class Ensemble(nn.Module):
    """K members built by ``factory()``; see the module docstring for what forward returns."""

    def __init__(self, factory: Callable[[], nn.Module], k: int):
        super().__init__()
        if not 2 <= k <= MAX_MEMBERS:
            raise ValueError(f"an ensemble has 2 to {MAX_MEMBERS} members, not {k}")
        self.members = nn.ModuleList(factory() for _ in range(k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return torch.stack([m(x) for m in self.members], 1)  # (N, K, classes)
        probs = sum(m(x).float().softmax(1) for m in self.members)
        return (probs / len(self.members)).log()


def nets(model: nn.Module) -> list[nn.Module]:
    """The separate nets in ``model``: an ensemble's members, else the model itself."""
    return list(model.members) if isinstance(model, Ensemble) else [model]


def member_loss(logits: torch.Tensor, targets: torch.Tensor,
                loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``loss`` of a training forward's logits: a single model's (N, classes) as they are; an
    ensemble's (N, K, classes) as the sum of its members' losses."""
    if logits.dim() != 3:
        return loss(logits, targets)
    k = logits.shape[1]
    return loss(logits.flatten(0, 1), targets.repeat_interleave(k)) * k


def combined(logits: torch.Tensor) -> torch.Tensor:
    """A training forward's logits as one prediction per image: an ensemble's members' averaged
    probabilities (as log-probabilities); a single model's logits as they are."""
    return logits if logits.dim() != 3 else F.softmax(logits.float(), -1).mean(1).log()
