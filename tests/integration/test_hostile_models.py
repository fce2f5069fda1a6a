"""Models too large for the machine are refused before anything is allocated (issue 19,
HOSTILE-INPUTS.md minor finding "huge model specs allocate before the memory preflight refuses
them (6.4 GB RSS)", and D12's ``summary fc100000000``): a spec is planned on the ``meta``
device when its upper bound is large, and refused in one ``MnistflowError`` naming its size.
In process (planning on ``meta`` costs ~2 s of one-time imports: not for the unit tier), and
``mnistflow summary`` as a user runs it, with its peak memory."""
from __future__ import annotations

import pytest
import torch
from helpers.cli import assert_one_line_error
from helpers.memory import peak_growth, run_measured

from mnistflow.core.errors import MnistflowError
from mnistflow.models import create_model, spec
from mnistflow.summary import summarize

GiB = 1 << 30


@pytest.fixture
def one_gib_free(monkeypatch):
    """A machine with 1 GiB available, whatever this one has; the meta device warmed up (its
    first use imports for seconds, which is not what is measured)."""
    monkeypatch.setattr(spec, "available_bytes", lambda: GiB)
    with torch.device("meta"):
        create_model("fc10,fc10", (1, 28, 28), 10)


def test_a_spec_over_10_gb_is_refused_before_allocating(one_gib_free):
    # 784 x 4,000,000 weights: 12.5 GB of float32
    def build():
        with pytest.raises(MnistflowError) as e:
            create_model("fc4000000,fc10", (1, 28, 28), 10)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("model spec 'fc4000000,fc10' needs 3,180,000,010 "
                                                  "parameters (11.8 GiB"), msg
        assert "more than the 1.0 GiB of memory available" in msg, msg

    out, grew = peak_growth(build)
    assert out is None and grew < 32 * 2**20, (out, grew)  # 12.5 GB if it were built


def test_summary_refuses_in_one_line_what_it_cannot_build(one_gib_free):
    for name, fragment in (("fc4000000,fc10", "model spec 'fc4000000,fc10' needs"),
                           ("fc100000000", "ends with 100000000 outputs but the data has 10 classes")):
        with pytest.raises(MnistflowError, match=fragment):
            summarize(name)
    # a registered model on a huge input: planned by name (seed-cnn's 69 billion weights)
    with pytest.raises(MnistflowError, match=r"model 'seed-cnn' for a 1x4096x4096 input needs "
                                             r"68,719,540,106 parameters \(256.0 GiB"):
        summarize("seed-cnn", "4096x4096")


def test_what_fits_is_built_as_before(one_gib_free):
    """The bound from the tokens alone keeps ordinary specs off the meta device (its first use
    costs seconds of imports) and never under-estimates what is built."""
    for text, shape in (("conv5x5x32-relu,maxpool2,conv5x5x64-relu,maxpool2,fc1024-relu,dropout0.5,fc10", (1, 28, 28)),
                        ("conv3x3x16-bn-relu,maxpool2,gap,fc10", (3, 32, 32)),
                        ("conv3x3x8-s2,bn,flatten,bn,fc20-relu,dropout0.2", (1, 28, 28)), ("fc10", (1, 28, 28))):
        bound = spec.upper_bound_bytes(text, shape, 10)
        model = create_model(text, shape, 10)
        assert spec.model_bytes(model) <= bound <= spec.PLAN_ABOVE, text
    torch.manual_seed(0)
    a = create_model("seed-cnn").state_dict()
    torch.manual_seed(0)
    with torch.device("meta"):  # planning draws no random numbers: runs stay bitwise the same
        create_model("seed-cnn")
    b = create_model("seed-cnn").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert "total params:         3,274,634" in summarize("seed-cnn")


def test_summary_of_a_huge_spec_is_one_line_in_small_memory():
    """``mnistflow summary`` of a spec needing 3 TB, and of seed-cnn on a 4096x4096 input
    (275 GB): one line each, in the memory of an ordinary summary (``summary fc100000000`` was a
    traceback after trying to allocate 313 GB; the preflight's case took 6.4 GB RSS)."""
    ordinary = run_measured("summary", "fast")[1]  # PyTorch's own share: more in a CUDA build
    for args, fragment in ((["fc1000000000,fc10"], "needs 795,000,000,010 parameters"),
                           (["seed-cnn", "--input", "4096x4096"], "model 'seed-cnn' for a 1x4096x4096 input")):
        proc, rss_kb = run_measured("summary", *args)
        assert_one_line_error(proc, fragment)
        assert rss_kb < ordinary + 200 * 1024, (args, rss_kb, ordinary)
