"""EMNIST: one split read from the published zip (its members read in place) or from the
split's separate files placed by hand; class names from the split's mapping file, else from
the known-dataset table. The images come out upright: EMNIST stores them transposed, and the
IDX reader turns any file of EMNIST's name (``idx.stored_transposed``), on every path.
"""
from __future__ import annotations

from pathlib import Path

from mnistflow.core import limits
from mnistflow.core.errors import fail
from mnistflow.data.formats.idx import ZipMember, idx_dataset, open_source, zip_names
from mnistflow.data.formats.raw import RawDataset
from mnistflow.data.known import KnownDataset, files_in



def read_emnist(ds: KnownDataset, folder: Path) -> RawDataset:
    """One EMNIST split from the zip in ``folder``, else from the split's separate files."""
    files = files_in(ds, folder)
    if not files:
        fail(folder, f"missing {ds.name} files: put {ds.by_hand()} here")
    if files[0].name == ds.files[0].name:  # the zip
        archive = files[0]
        members = {n.rsplit("/", 1)[-1]: n for n in zip_names(archive)}
        wanted = list(ds.loose_files)
        missing = [w for w in wanted if w not in members]
        if missing:
            fail(archive, f"is not EMNIST's zip: it has no {', '.join(missing)}")
        src = [ZipMember(archive, members[w]) for w in wanted]
        mapping = ZipMember(archive, members[ds.mapping]) if ds.mapping in members else None
    else:
        src = files[:4]
        mapping = files[4] if len(files) > 4 else None
    names = read_emnist_mapping(mapping) if mapping is not None else ds.names
    return idx_dataset(ds.name, *src, names, files)  # upright: ``idx.read_idx`` knows the names


def read_emnist_mapping(src: Path | ZipMember) -> dict[int, str]:
    """{label: name} from an EMNIST mapping file: lines "label ascii_code [ascii_code]"; a
    label with two codes (letters: "1 65 97", upper and lower case merged) is named by the
    last, so that letters are 'a'..'z'."""
    with open_source(src, gz=False) as (f, _, _):
        data = f.read(limits.MAX_EMNIST_MAPPING_BYTES + 1)
    if len(data) > limits.MAX_EMNIST_MAPPING_BYTES:
        fail(src, f"more than {limits.MAX_EMNIST_MAPPING_BYTES:,} bytes: not an EMNIST mapping file")
    names: dict[int, str] = {}
    for n, line in enumerate(data.decode("ascii", "replace").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        nums = [int(p) for p in parts if p.isdigit()]
        if (len(nums) != len(parts) or not 2 <= len(nums) <= 3 or nums[0] >= limits.MAX_CLASSES
                or not all(32 < c < 127 for c in nums[1:])):  # printable ASCII, no space
            fail(src, f"line {n}: expected 'label ascii_code [ascii_code]', got {line[:40]!r}")
        if nums[0] in names:
            fail(src, f"line {n}: label {nums[0]} is mapped twice")
        names[nums[0]] = chr(nums[-1])
    if not names:
        fail(src, "is empty: no 'label ascii_code' lines")
    return names
