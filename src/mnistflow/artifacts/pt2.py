"""PT2: a model as a ``torch.export`` program (``.pt2``), and a ``.pt2`` file read back as a model.

    mnistflow export runs/fast-1 --format pt2    # to_pt2 (exporting.py verifies, then writes)
    mnistflow eval runs/fast-1/model.pt2         # load_pt2: an ExportedModel, run by PyTorch
    python -c "import torch; m = torch.export.load('runs/fast-1/model.pt2').module(); \
print(m(torch.zeros(1, 1, 28, 28)).shape)"       # PyTorch alone: no mnistflow, no model code

The program takes one (N, C, H, W) float32 batch, normalized, with a dynamic N, and gives the
logits (N, K). It was traced in eval mode (batch norm on its running statistics, no dropout)
and stays so. The model's info (class names, normalization; ``model_info``'s JSON, as in the
other formats) rides in the archive as ``extra/mnistflow.json``.

Trust: a .pt2 is a program, not data. ``torch.export.load`` unpickles parts of the archive
(PyTorch's own warning: never load one from an untrusted source), and the graph it rebuilds may
call any function PyTorch can reach. ``load.load_any`` loads one only when the user has said
they trust their .pt2 files as code (``$MNISTFLOW_TRUST_PT2=1``). The checks here (a regular file of at most
``limits.MAX_MODEL_BYTES``; a zip; mnistflow info of at most ``limits.MAX_MODEL_META_CHARS``
that ``check_model_info`` accepts, read before torch sees the file; one input and one output of
the info's shapes; finite weights) turn a broken or foreign file into one error line. They do
not make a hostile one safe.
"""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

import torch
import torch.nn as nn

from mnistflow.artifacts.model_file import check_values, unwrap
from mnistflow.artifacts.model_info import META_KEY, ModelInfo, info_from_json
from mnistflow.artifacts.onnx import quiet_exporter
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.core.fsutil import read_regular

INFO_FILE = f"{META_KEY}.json"  # the extra file holding the ModelInfo JSON
_EXTRA_DIR = "extra/"  # where torch.export.save puts extra files, under the archive's root folder


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{e.__class__.__name__}: {text.splitlines()[0][:200]}" if text else e.__class__.__name__


def to_pt2(model: nn.Module, info: ModelInfo) -> bytes:
    """The model as ``.pt2`` bytes: ``torch.export`` of its eval-mode forward on a (N, C, H, W)
    batch with a dynamic N, its info in ``extra/mnistflow.json``. A model torch.export cannot
    trace (e.g. control flow on the values of a tensor) is one ``MnistflowError``."""
    model = unwrap(model).cpu().eval()
    x = torch.zeros(2, *info.in_shape)  # not 1: torch.export would fix a batch of 1
    try:
        with quiet_exporter():
            program = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
            buf = io.BytesIO()
            torch.export.save(program, buf, extra_files={INFO_FILE: info.to_json()})
    except Exception as e:  # torch.export raises many types (UserError, GuardOnDataDependentSymNode, ...)
        raise MnistflowError(f"torch.export of '{info.model}' failed ({_first_line(e)})") from None
    return buf.getvalue()


def read_pt2_info(blob: bytes, where: str | Path) -> ModelInfo:
    """The ModelInfo of ``.pt2`` bytes, read with ``zipfile`` (torch is not involved): its size
    declared and read at most ``limits.MAX_MODEL_META_CHARS`` bytes (the JSON is ASCII), then
    checked by ``model_info.info_from_json``."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            names = z.namelist()
            root = names[0].split("/", 1)[0] if names else ""  # torch's reader takes the first's folder
            if f"{root}/archive_format" not in names:
                raise MnistflowError("not a torch.export archive (no archive_format entry)", where)
            member = next((i for i in z.infolist() if i.filename == f"{root}/{_EXTRA_DIR}{INFO_FILE}"), None)
            if member is None:
                raise MnistflowError("has no mnistflow info (a .pt2 that 'mnistflow export --format pt2' "
                                     "did not write)", where)
            if member.file_size > limits.MAX_MODEL_META_CHARS:
                raise MnistflowError(f"its mnistflow info declares {member.file_size:,} bytes (at most "
                                     f"{limits.MAX_MODEL_META_CHARS:,})", where)
            with z.open(member) as f:
                raw = f.read(limits.MAX_MODEL_META_CHARS + 1)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError,
            NotImplementedError, RuntimeError) as e:  # RuntimeError: an encrypted member
        raise MnistflowError(f"not a readable .pt2 archive ({_first_line(e)})", where) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MnistflowError("its mnistflow info is not UTF-8 text", where) from None
    return info_from_json(text, where)


def _shape_fits(val: object, want: list[int]) -> bool:
    """``val`` (a traced tensor) has ``len(want) + 1`` dimensions: a symbolic (dynamic) first,
    then exactly ``want``."""
    shape = getattr(val, "shape", None)
    return (shape is not None and len(shape) == len(want) + 1 and isinstance(shape[0], torch.SymInt)
            and [d if isinstance(d, int) else None for d in shape[1:]] == list(want))


def _check_program(program: torch.export.ExportedProgram, info: ModelInfo, where: Path) -> None:
    """One input (N, C, H, W) and one output (N, K) of the info's shapes, N dynamic; finite
    weights (``model_file.check_values``, as every other format's)."""
    sig = program.graph_signature
    nodes = {n.name: n for n in program.graph.nodes}
    if len(sig.user_inputs) != 1 or len(sig.user_outputs) != 1:
        raise MnistflowError(f"the program takes {len(sig.user_inputs)} inputs and gives "
                             f"{len(sig.user_outputs)} outputs; expected one image batch and its logits", where)
    x, y = nodes.get(sig.user_inputs[0]), nodes.get(sig.user_outputs[0])
    c, h, w = info.in_shape
    if x is None or not _shape_fits(x.meta.get("val"), [c, h, w]):
        raise MnistflowError(f"the program's input {_shape(x)} is not (N, {c}, {h}, {w}) with a dynamic N, "
                             "as its mnistflow info says", where)
    if y is None or not _shape_fits(y.meta.get("val"), [info.num_classes]):
        raise MnistflowError(f"the program's output {_shape(y)} is not (N, {info.num_classes}) logits, "
                             "as its mnistflow info says", where)
    check_values(dict(program.state_dict), where)


def _shape(node) -> str:
    shape = getattr(getattr(node, "meta", {}).get("val"), "shape", None)
    return "(unknown shape)" if shape is None else "(" + ", ".join(map(str, shape)) + ")"


class ExportedModel(nn.Module):
    """A ``.pt2`` program as a module: ``forward`` runs the traced graph, which has no training
    mode (it was traced in eval mode), so ``train()`` and ``eval()`` change nothing and
    ``training`` stays False. Its parameters are the program's (``program.*``)."""

    def __init__(self, program: nn.Module):
        super().__init__()
        self.program = program
        self.training = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.program(x)

    def train(self, mode: bool = True) -> ExportedModel:
        return self  # torch.export's module refuses train()/eval(): its graph is fixed


def program_from_bytes(blob: bytes, where: str | Path, device: torch.device | str = "cpu"
                       ) -> tuple[ExportedModel, ModelInfo]:
    """``.pt2`` bytes as an ``ExportedModel`` on ``device`` and its info: the info first
    (``read_pt2_info``), then ``torch.export.load`` (which trusts the file: see the module's
    docstring), then the program against the info (``_check_program``)."""
    p = Path(where)
    info = read_pt2_info(blob, p)
    try:
        with quiet_exporter():  # torch logs a warning (and a traceback) before its own error
            program = torch.export.load(io.BytesIO(blob))
    except Exception as e:  # a damaged archive fails anywhere in torch's deserializer
        raise MnistflowError(f"not a loadable torch.export program ({_first_line(e)})", p) from None
    _check_program(program, info, p)
    if torch.device(device).type != "cpu":  # the graph's device arguments move too, not only weights
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, torch.device(device))
    return ExportedModel(program.module()), info


def load_pt2(path: str | Path, device: torch.device | str = "cpu") -> tuple[ExportedModel, ModelInfo]:
    """A ``.pt2`` file written by ``mnistflow export --format pt2`` as an ``ExportedModel`` on
    ``device``, and its info; read whole (a regular file of at most ``limits.MAX_MODEL_BYTES``),
    so the info checked and the program loaded come from the same bytes."""
    blob = read_regular(path, limits.MAX_MODEL_BYTES, "exported program")
    return program_from_bytes(blob, path, device)
