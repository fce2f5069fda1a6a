"""Pictures whose decoding costs far more than their pixels (issue 40, HOSTILE-INPUTS.md R2):
a progressive JPEG of thousands of scans is refused before decoding, by the one check every
path that decodes a picture goes through (``data.formats.image.decode_cost_problem``, from
``open_picture``: ``predict``'s files, ``prep`` of folders and TFRecords; and the server's
uploads), and only the picture formats are opened at all."""
from __future__ import annotations

import io
import time

import numpy as np
import pytest
from helpers.images import png, scan_bomb_jpeg

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.data.formats import folder
from mnistflow.data.formats.image import jpeg_scans
from mnistflow.data.picture import read_picture
from mnistflow.server.guard import BadInput
from mnistflow.server.inputs import decode_image

VARIANTS = {  # 20,000 scans of a 1024x1024 picture: 2 to 3.5 s of CPU each before the check
    "progressive": dict(),
    "fill-bytes": dict(fill=True),  # an FF before each marker, which decoders skip
    "colour": dict(mode="RGB"),
    "baseline": dict(progressive=False),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_r2_a_scan_bomb_is_refused_before_decoding_on_every_path(tmp_path, variant):
    data = scan_bomb_jpeg(1024, 20_000, **VARIANTS[variant])
    path = tmp_path / "scans.jpg"
    path.write_bytes(data)
    why = f"refusing to decode a JPEG of more than {limits.MAX_JPEG_SCANS} scans"
    readers = {
        "predict": lambda: read_picture(path),
        "prep folder": lambda: folder.decode_image(path, path),
        "tfrecord bytes": lambda: folder.decode_image(data, "x.tfrecord: record 0"),
    }
    for name, read in readers.items():
        t0 = time.process_time()
        with pytest.raises(MnistflowError, match=why):
            read()
        assert time.process_time() - t0 < 0.5, name
    t0 = time.process_time()
    with pytest.raises(BadInput) as e:
        decode_image(data)
    assert e.value.status == 413 and why in e.value.message
    assert time.process_time() - t0 < 0.5


def test_r2_a_prep_of_a_folder_with_a_scan_bomb_is_one_error(tmp_path):
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        (tmp_path / c / "ok.png").write_bytes(png(np.zeros((28, 28), np.uint8)))
    (tmp_path / "b" / "bomb.jpg").write_bytes(scan_bomb_jpeg(1024, 20_000))
    with pytest.raises(MnistflowError, match=r"bomb\.jpg: refusing to decode a JPEG of more than 100 scans"):
        folder.read_image_folder(tmp_path)


def test_r2_real_progressive_jpegs_pass_and_the_bound_is_exact(tmp_path):
    from PIL import Image

    for mode, shape in (("L", (300, 400)), ("RGB", (300, 400, 3))):
        a = np.random.default_rng(1).integers(0, 255, shape).astype(np.uint8)
        b = io.BytesIO()
        Image.fromarray(a).save(b, format="JPEG", progressive=True, optimize=True)
        assert jpeg_scans(io.BytesIO(b.getvalue())) in (6, 10)
        assert decode_image(b.getvalue()).shape[:2] == (300, 400)
    at, over = scan_bomb_jpeg(256, limits.MAX_JPEG_SCANS), scan_bomb_jpeg(256, limits.MAX_JPEG_SCANS + 1)
    (tmp_path / "at.jpg").write_bytes(at)
    (tmp_path / "over.jpg").write_bytes(over)
    assert read_picture(tmp_path / "at.jpg").shape == (256, 256)
    with pytest.raises(MnistflowError, match="more than 100 scans"):
        read_picture(tmp_path / "over.jpg")


def test_jpeg_scans_counts_a_marker_across_its_read_boundary_and_keeps_the_position():
    data = b"\xff\xd8" + b"\0" * ((1 << 20) - 3) + b"\xff\xda" + b"\0" * 10 + b"\xff\xda"
    assert data[(1 << 20) - 1:(1 << 20) + 1] == b"\xff\xda"  # split by the 1 MiB reads
    fh = io.BytesIO(data)
    fh.seek(7)
    assert jpeg_scans(fh) == 2 and fh.tell() == 7
    assert jpeg_scans(io.BytesIO(b"\xff\xda" * (3 << 19)), stop=5) == 1 << 19  # reading stops past the bound


def test_a_picture_file_of_another_format_is_not_opened(tmp_path):
    """Pillow opens many formats by their content whatever the name (an EPS runs Ghostscript);
    a picture is PNG, JPEG, WebP, GIF or BMP."""
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(b, format="TIFF")
    (tmp_path / "x.png").write_bytes(b.getvalue())
    (tmp_path / "y.png").write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 28 28\n")
    for name in ("x.png", "y.png"):
        with pytest.raises(MnistflowError, match="not a readable PNG/JPEG image"):
            read_picture(tmp_path / name)


@pytest.mark.parametrize("kind", ["empty-idat", "unknown-chunks"])
def test_png_chunk_floods_cost_what_their_bytes_do(kind):
    """Variants tried for PNG (R2): 2 MB of empty IDAT chunks or of unknown chunks decode in
    well under a second (Pillow reads chunks in a tight loop; zlib bombs are bounded by the
    pixel cap, text chunks by Pillow's own caps), so no bound is needed beyond the body's."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z = zlib.compress(b"".join(b"\0" + bytes(64) for _ in range(64)))
    head = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 0, 0, 0, 0))
    if kind == "empty-idat":
        body = chunk(b"IDAT", z[:1]) + chunk(b"IDAT", b"") * 170_000 + chunk(b"IDAT", z[1:])
    else:
        body = chunk(b"zzZz", b"x" * 10) * 95_000 + chunk(b"IDAT", z)
    data = head + body + chunk(b"IEND", b"")
    assert len(data) <= limits.MAX_BODY_BYTES
    t0 = time.process_time()
    assert decode_image(data).shape == (64, 64)
    assert time.process_time() - t0 < 3
