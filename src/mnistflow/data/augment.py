"""Augmentation on the device that trains (batched), and the once-only variants for prep.

Each known dataset declares a *policy* (``KnownDataset.augment``); ``--augment auto`` takes it:

* ``glyphs`` (digits, letters, kana): small shifts and rotations, never flips (a flipped 2 or
  'b' is another class or no class);
* ``clothing`` (Fashion-MNIST): horizontal flips and shifted crops (a mirrored shoe is a shoe);
* ``photos`` (CIFAR-10): reflect-padded crops, horizontal flips and cutout;
* ``shifts``: shifts of a few pixels only, what ``auto`` takes for inputs it knows nothing of
  (no flip or rotation that could change a class).

A policy is two halves: ``draw`` takes every random number of a batch from the loader's CPU
generator, ``apply`` transforms the float (N, C, H, W) batch (0..255) on its device. A resume
mid-epoch replays the draws without the images (:func:`skip`), so the stream stays aligned
bit for bit whatever the policy.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# --- the building blocks ---------------------------------------------------------------------

DRAWS = 3  # random numbers per image that shift_rotate takes from its generator
CROP_PAD = 4


def _affine_grid(x: torch.Tensor, r: torch.Tensor, max_shift: float, max_degrees: float) -> torch.Tensor:
    """The sampling grid (N, H, W, 2) that rotates and translates each image of ``x`` by its
    row of ``r`` (N, 3) in [-1, 1)."""
    h, w = x.shape[-2:]
    r = r.to(x.device)
    ang = r[:, 0] * math.radians(max_degrees)
    cos, sin = torch.cos(ang), torch.sin(ang)
    # affine_grid works in normalized [-1, 1] coordinates: a shift of s pixels is 2s/size.
    tx = r[:, 1] * max_shift * 2 / w
    ty = r[:, 2] * max_shift * 2 / h
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    return F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)


def _rotate_shift(x: torch.Tensor, r: torch.Tensor, max_shift: float, max_degrees: float) -> torch.Tensor:
    """Rotate and translate each image of ``x`` by its row of ``r`` (N, 3) in [-1, 1)."""
    grid = _affine_grid(x, r, max_shift, max_degrees)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


ELASTIC_POINTS = 4  # control points per side of the random displacement field
ELASTIC_PIXELS = 2.0  # the largest displacement of a control point, in pixels


def _elastic(x: torch.Tensor, r: torch.Tensor, field: torch.Tensor) -> torch.Tensor:
    """``_rotate_shift`` plus an elastic distortion (Simard et al., 2003): each image's coarse
    random displacement ``field`` (N, 2, P, P) in [-1, 1), bicubically smoothed to every pixel
    (the cheap equivalent of a Gaussian-filtered per-pixel field), added to the affine grid."""
    n, _, h, w = x.shape
    grid = _affine_grid(x, r, 2.0, 10.0)
    smooth = _smoothing(h, w).to(x.device, x.dtype)
    disp = (field.to(x.device, x.dtype).reshape(n * 2, -1) @ smooth).view(n, 2, h, w)
    scale = torch.tensor([2 * ELASTIC_PIXELS / w, 2 * ELASTIC_PIXELS / h], device=x.device, dtype=x.dtype)
    grid = grid + disp.permute(0, 2, 3, 1) * scale
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


@functools.lru_cache(maxsize=8)
def _smoothing(h: int, w: int) -> torch.Tensor:
    """(P * P, H * W): the bicubic interpolation of a P x P control-point field to every pixel,
    as one matrix (interpolation is linear), so a batch's fields are smoothed by one product:
    ~25x cheaper on a CPU than ``F.interpolate``'s per-pixel work, which starved the step."""
    p = ELASTIC_POINTS
    basis = torch.eye(p * p).view(p * p, 1, p, p)
    return F.interpolate(basis, size=(h, w), mode="bicubic", align_corners=True).view(p * p, h * w)


def shift_rotate(x: torch.Tensor, gen: torch.Generator | None = None, max_shift: float = 2.0,
                 max_degrees: float = 10.0) -> torch.Tensor:
    """Random translation (pixels) and rotation (degrees) of a float batch (N, C, H, W).
    Draws ``DRAWS`` numbers per image from ``gen``."""
    r = torch.rand(x.shape[0], DRAWS, generator=gen, device="cpu") * 2 - 1
    return _rotate_shift(x, r, max_shift, max_degrees)


def _crop(x: torch.Tensor, off: torch.Tensor, pad: int, mode: str) -> torch.Tensor:
    """Each image of ``x`` padded by ``pad`` (``mode``: reflect, replicate, constant) and cropped
    back to its size at its offset ``off`` (N, 2) (row, column) in [0, 2 * pad]."""
    if pad == 0:
        return x
    n, c, h, w = x.shape
    wide = w + 2 * pad
    padded = F.pad(x, (pad, pad, pad, pad), mode=mode).reshape(n, c, -1)
    # one gather over the flattened padded image (faster on a CPU than a gather per axis)
    off = off.to(x.device)
    pixels = (torch.arange(h, device=x.device).view(h, 1) * wide + torch.arange(w, device=x.device)).view(1, -1)
    idx = off[:, 0:1] * wide + off[:, 1:2] + pixels  # (N, H * W)
    return padded.gather(2, idx.view(n, 1, h * w).expand(n, c, h * w)).view(n, c, h, w)


def _hflip(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The images whose draw ``u`` (N,) is below 0.5 mirrored left to right."""
    flip = (u < 0.5).to(x.device).view(-1, 1, 1, 1)
    return torch.where(flip, x.flip(3), x)


def _cutout(x: torch.Tensor, centre: torch.Tensor, size: int, fill: torch.Tensor | None) -> torch.Tensor:
    """A ``size`` x ``size`` square around each image's ``centre`` (N, 2) (clipped at the
    borders, as in DeVries & Taylor 2017) set to ``fill`` (per channel, (1, C, 1, 1): the
    normalization mean, so the square is 0 in the normalized batch; None: 0)."""
    n, _, h, w = x.shape
    top = (centre[:, 0:1] - size // 2).to(x.device)
    left = (centre[:, 1:2] - size // 2).to(x.device)
    rows = torch.arange(h, device=x.device).view(1, h)
    cols = torch.arange(w, device=x.device).view(1, w)
    in_rows = (rows >= top) & (rows < top + size)  # (N, H)
    in_cols = (cols >= left) & (cols < left + size)  # (N, W)
    square = (in_rows.view(n, 1, h, 1) & in_cols.view(n, 1, 1, w))
    value = torch.zeros((), dtype=x.dtype, device=x.device) if fill is None else fill.to(x.dtype)
    return torch.where(square, value, x)


def crop_flip(x: torch.Tensor, gen: torch.Generator | None = None, pad: int = CROP_PAD) -> torch.Tensor:
    """Random crops of a reflect-padded batch plus horizontal flips, (N, C, H, W)."""
    n = x.shape[0]
    off = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen)
    u = torch.rand(n, generator=gen)
    return _hflip(_crop(x, off, pad, "reflect"), u)


# --- the policies ----------------------------------------------------------------------------

Draws = tuple  # the random numbers of one batch, CPU tensors


@dataclass(frozen=True)
class Policy:
    """A named augmentation: ``draw(n, h, w, gen)`` takes the batch's random numbers (CPU),
    ``apply(x, draws, fill)`` transforms the float batch with them on its device."""

    name: str
    what: str  # one line: what it does (help texts, notes, the README)
    draw: Callable[[int, int, int, torch.Generator | None], Draws]
    apply: Callable[[torch.Tensor, Draws, torch.Tensor | None], torch.Tensor]
    mirror: bool = False  # a mirrored image is of the same class (test-time views may mirror)


def _pad_for(h: int, w: int, pad: int) -> int:
    """``pad``, small enough for a reflect pad of an h x w image (tiny images: less)."""
    return max(0, min(pad, h - 1, w - 1))


def _shift_pad(h: int, w: int) -> int:
    """The largest shift of the ``shifts`` policy: ~7% of the side, 2 pixels at 28 or 32."""
    return _pad_for(h, w, max(1, round(min(h, w) / 14)))


CLOTHING_PAD = 2  # 28x28 clothing: a 4-pixel crop margin cuts collars and soles off
CUTOUT_FRACTION = 4  # photos' cutout square: a quarter of the side (8 px at 32)


def _glyphs_draw(n, h, w, gen):
    return (torch.rand(n, DRAWS, generator=gen, device="cpu") * 2 - 1,)


def _glyphs_apply(x, d, fill):
    return _rotate_shift(x, d[0], 2.0, 10.0)


def _elastic_draw(n, h, w, gen):
    r = torch.rand(n, DRAWS, generator=gen, device="cpu") * 2 - 1
    return r, torch.rand(n, 2, ELASTIC_POINTS, ELASTIC_POINTS, generator=gen, device="cpu") * 2 - 1


def _elastic_apply(x, d, fill):
    return _elastic(x, d[0], d[1])


def _shifts_draw(n, h, w, gen):
    return (torch.randint(0, 2 * _shift_pad(h, w) + 1, (n, 2), generator=gen),)


def _shifts_apply(x, d, fill):
    return _crop(x, d[0], _shift_pad(*x.shape[-2:]), "replicate")


def _clothing_draw(n, h, w, gen):
    pad = _pad_for(h, w, CLOTHING_PAD)
    return torch.randint(0, 2 * pad + 1, (n, 2), generator=gen), torch.rand(n, generator=gen)


def _clothing_apply(x, d, fill):
    h, w = x.shape[-2:]
    return _hflip(_crop(x, d[0], _pad_for(h, w, CLOTHING_PAD), "constant"), d[1])


def _photos_draw(n, h, w, gen):
    pad = _pad_for(h, w, CROP_PAD)
    off = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen)  # crop_flip's draws, then cutout's
    u = torch.rand(n, generator=gen)
    centre = torch.stack([torch.randint(0, h, (n,), generator=gen), torch.randint(0, w, (n,), generator=gen)], 1)
    return off, u, centre


def _photos_apply(x, d, fill):
    h, w = x.shape[-2:]
    x = _hflip(_crop(x, d[0], _pad_for(h, w, CROP_PAD), "reflect"), d[1])
    return _cutout(x, d[2], max(1, min(h, w) // CUTOUT_FRACTION), fill)


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("glyphs", "small shifts (2 px) and rotations (10 degrees), never flips", _glyphs_draw, _glyphs_apply),
    Policy("elastic", "glyphs' shifts and rotations plus elastic distortion (2 px), never flips",
           _elastic_draw, _elastic_apply),
    Policy("clothing", "horizontal flips and shifted crops (2 px)", _clothing_draw, _clothing_apply, mirror=True),
    Policy("photos", "padded crops (4 px), horizontal flips and cutout", _photos_draw, _photos_apply, mirror=True),
    Policy("shifts", "shifts of a few pixels only (no flips, no rotations)", _shifts_draw, _shifts_apply),
)}
SAFE_DEFAULT = "shifts"  # auto, for inputs that are not a known dataset with a policy


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        from mnistflow.core.errors import MnistflowError

        raise MnistflowError(f"unknown augmentation policy '{name}' (known: {', '.join(POLICIES)})")
    return POLICIES[name]


def mirror_safe(dataset: str | None) -> bool:
    """Whether a mirrored image of the dataset named ``dataset`` is of the same class (its own
    policy flips: clothing, photos), so test-time views may mirror it (``--tta``)."""
    return POLICIES[resolve_policy("auto", dataset)[0]].mirror


def resolve_policy(choice: str, dataset: str | None) -> tuple[str, str | None]:
    """(the policy ``--augment choice`` means for records named ``dataset``, a note to show or
    None). ``auto``: the known dataset's own policy, else ``SAFE_DEFAULT`` (and the note says
    so); ``off`` and policy names are themselves."""
    if choice != "auto":
        if choice != "off":
            get_policy(choice)
        return choice, None
    from mnistflow.data.known import lookup

    entry = lookup(dataset) if dataset else None
    own = getattr(entry, "augment", None)
    if own in POLICIES:
        return own, None
    what = f"'{dataset}' is not a known dataset" if entry is None else f"{entry.name} declares no policy"
    return SAFE_DEFAULT, (f"--augment auto: {what}, so {SAFE_DEFAULT}: {POLICIES[SAFE_DEFAULT].what} "
                          f"(or name one: --augment {'|'.join(p for p in POLICIES if p != SAFE_DEFAULT)}, "
                          f"or off)")


def augment(x: torch.Tensor, gen: torch.Generator | None, policy: str | Policy,
            fill: torch.Tensor | None = None) -> torch.Tensor:
    """A float batch (N, C, H, W) augmented by ``policy``, its random numbers from ``gen``.
    ``fill``: per-channel value of erased pixels (cutout), (1, C, 1, 1); None: 0."""
    p = get_policy(policy) if isinstance(policy, str) else policy
    n, _, h, w = x.shape
    return p.apply(x, p.draw(n, h, w, gen), fill)


def skip(gen: torch.Generator, policy: str | Policy, batches: int, batch_size: int, h: int, w: int) -> None:
    """Advance ``gen`` past ``batches`` full batches of ``policy`` (a resume mid-epoch): the
    same draws, without the images."""
    p = get_policy(policy) if isinstance(policy, str) else policy
    for _ in range(batches):
        p.draw(batch_size, h, w, gen)


def augment_batch(x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """The channel-count default of ``prep --variants``: crop/flip for colour, shift/rotate for grey."""
    return crop_flip(x, gen) if x.shape[1] == 3 else shift_rotate(x, gen)


# --- test-time shifts ------------------------------------------------------------------------

TTA_SHIFTS = ((0, -1), (0, 1), (-1, 0), (1, 0), (-1, -1), (1, 1), (-1, 1), (1, -1))  # (dy, dx)


def shifted(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``x`` (N, C, H, W) moved by (dy, dx) pixels (|d| <= 1), the edge repeated into the gap;
    the memory format of ``x`` is kept."""
    h, w = x.shape[-2:]
    p = F.pad(x, (1, 1, 1, 1), mode="replicate")
    out = p[..., 1 - dy:1 - dy + h, 1 - dx:1 - dx + w]
    fmt = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] > 1 \
        else torch.contiguous_format
    return out.contiguous(memory_format=fmt)


def make_variant(x: np.ndarray, seed: int, chunk: int = 8192) -> np.ndarray:
    """One augmented copy of uint8 NHWC images (for ``prep --variants``), on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    out = np.empty_like(x)
    for i in range(0, len(x), chunk):
        xb = torch.from_numpy(np.ascontiguousarray(x[i:i + chunk])).permute(0, 3, 1, 2).float()
        yb = augment_batch(xb, gen)
        out[i:i + chunk] = yb.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return out
