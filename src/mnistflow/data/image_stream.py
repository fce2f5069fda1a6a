"""The images ``predict`` classifies, a batch at a time: memory bounded by the batch, not by
how many images there are.

    stream = ImageStream.of_paths([Path("t10k-images-idx3-ubyte.gz"), Path("d.png")], target)
    len(stream)                       # images in all (IDX headers read, pictures counted)
    for batch in stream.batches(256):
        batch.names, batch.images, batch.preprocess   # names, uint8 (B, H, W, C), the way each was made

Three kinds of source, in the order given: an IDX file (every image in it, named
``file[i]``, streamed a batch at a time by ``formats.idx.IdxImages``: the dataset's own
images, used as they are), a picture file (decoded when its batch is made: made as the model's
dataset images were, ``picture.prepare``, or with ``as_is`` only resized,
``picture.as_is``), or an array already at the model's size (``array[i]``). A batch may take
images from several sources. Headers and missing files are found when the stream is made,
before anything is classified; a picture that cannot be decoded, or an IDX file found broken
part-way (a truncated gzip stream), when its batch is read.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnistflow.core.errors import MnistflowError
from mnistflow.data import picture
from mnistflow.data.formats.idx import IdxImages


def is_idx_file(path: Path) -> bool:
    """Whether ``predict`` reads ``path`` as an IDX image file (told by its name)."""
    return "idx3-ubyte" in path.name or path.suffix in (".idx", ".idx3")


def pictures_in(folder: Path) -> list[Path]:
    """The pictures in ``folder`` (not its sub-folders), sorted by name; none is an error."""
    from mnistflow.data.formats.image import PICTURE_SUFFIXES

    try:
        found = sorted(p for p in folder.iterdir() if p.suffix.lower() in PICTURE_SUFFIXES
                       and not p.name.startswith(".") and p.is_file())
    except OSError as e:
        raise MnistflowError(f"cannot list the folder ({e.strerror or e})", folder) from None
    if not found:
        raise MnistflowError(f"a folder with no pictures ({', '.join(PICTURE_SUFFIXES)}) in it", folder)
    return found


@dataclass
class ImageBatch:
    """Consecutive images of a stream: their names, the images as the model's input (uint8
    (B, H, W, C) at its size) and the way each was made (``none``: as it was; else a style of
    ``picture.STYLES``)."""

    names: list[str]
    images: np.ndarray
    preprocess: list[str]

    def __len__(self) -> int:
        return len(self.names)


class ImageStream:
    """Images for a model whose input is ``target.shape``, from IDX files, picture files or
    arrays (see the module docstring; a stream of arrays alone needs no ``target``)."""

    def __init__(self, sources: list[IdxImages | Path | np.ndarray], target: picture.Target | None,
                 *, as_is: bool = False, max_pixels: int | None = None):
        self.sources, self.target, self.as_is, self.max_pixels = sources, target, as_is, max_pixels

    @classmethod
    def of_paths(cls, paths: list[Path], target: picture.Target, *, as_is: bool = False,
                 max_pixels: int | None = None) -> ImageStream:
        """A stream of the images in ``paths``, in order: each IDX file's header is read and
        checked now (``IdxImages``: one rank-3 image file), and each picture must exist."""
        sources: list[IdxImages | Path | np.ndarray] = []
        for p in paths:
            if is_idx_file(p):
                sources.append(IdxImages(p, ranks=(3,)))
            elif not p.exists():
                raise MnistflowError("no such file", p)
            else:
                sources.append(p)
        return cls(sources, target, as_is=as_is, max_pixels=max_pixels)

    def __len__(self) -> int:
        return sum(len(s) if not isinstance(s, Path) else 1 for s in self.sources)

    def name_width(self) -> int:
        """The length of the longest image name."""
        return max(len(f"{s.path.name}[{len(s) - 1}]") if isinstance(s, IdxImages)
                   else len(f"array[{len(s) - 1}]") if isinstance(s, np.ndarray) else len(str(s))
                   for s in self.sources)

    def batches(self, size: int) -> Iterator[ImageBatch]:
        """Batches of ``size`` images (the last one may hold fewer), across the sources."""
        names: list[str] = []
        how: list[str] = []
        parts: list[np.ndarray] = []
        for piece in self._pieces(size):
            start = 0
            while start < len(piece):
                take = min(size - len(names), len(piece) - start)
                names += piece.names[start:start + take]
                how += piece.preprocess[start:start + take]
                parts.append(piece.images[start:start + take])
                start += take
                if len(names) == size:
                    yield ImageBatch(names, _joined(parts), how)
                    names, how, parts = [], [], []
        if names:
            yield ImageBatch(names, _joined(parts), how)

    def _pieces(self, size: int) -> Iterator[ImageBatch]:
        """The sources' images as they come: an IDX file or an array ``size`` images at a time,
        a picture file alone."""
        for s in self.sources:
            if isinstance(s, IdxImages):
                start, name = 0, s.path.name
                for x in s.batches(size):
                    yield ImageBatch([f"{name}[{i}]" for i in range(start, start + len(x))],
                                     self._as_input(x), ["none"] * len(x))
                    start += len(x)
            elif isinstance(s, np.ndarray):
                for start in range(0, len(s), size):
                    x = s[start:start + size]
                    yield ImageBatch([f"array[{i}]" for i in range(start, start + len(x))], x,
                                     ["none"] * len(x))
            else:
                img, way = self._picture(s)
                yield ImageBatch([str(s)], img[None], [way])

    def _picture(self, path: Path) -> tuple[np.ndarray, str]:
        img = picture.read_picture(path, self.max_pixels)
        if self.as_is:
            return picture.as_is(img, self.target.shape), "none"
        return picture.prepare(img, self.target)

    def _as_input(self, x: np.ndarray) -> np.ndarray:
        """IDX images (B, H, W) as the model's input, as ``picture.as_is`` makes each (without
        its per-image work where the size is already the model's)."""
        c, h, w = self.target.shape
        if x.shape[1:] == (h, w) and c in (1, 3):
            return x[..., None] if c == 1 else np.repeat(x[..., None], c, axis=3)
        return np.stack([picture.as_is(a, self.target.shape) for a in x])


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
