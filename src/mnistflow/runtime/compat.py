"""The private PyTorch APIs mnistflow uses, in one place: a PyTorch upgrade that moves one breaks
here, named, and nowhere else. Each has no public equivalent in the PyTorch versions supported
(pyproject's torch range)."""
from __future__ import annotations

import torch


def profiler_enabled() -> bool:
    """Whether a ``torch.profiler`` is recording now (the loop names its phases only then)."""
    return bool(torch.autograd.profiler._is_profiler_enabled)


def set_recompile_logs() -> None:
    """Report each ``torch.compile`` recompilation with its reason (``TORCH_LOGS=recompiles``)."""
    torch._logging.set_logs(recompiles=True)


def inductor_cache_dir() -> str:
    """Where ``torch.compile`` (inductor) writes the code it generates: $TORCHINDUCTOR_CACHE_DIR,
    else its default under the temporary directory."""
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
