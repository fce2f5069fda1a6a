#!/usr/bin/env bash
# Set up mnistflow from scratch: a virtual environment in .venv with PyTorch and the package
# (editable) with the extras named in $MNISTFLOW_EXTRAS.
# Usage: source-free; other scripts call it. Safe to run again (pip skips what is there).
#   MNISTFLOW_TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
#       takes torch from that index: PyTorch's CPU-only build (the CUDA builds' indexes:
#       https://pytorch.org/get-started/locally/).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${MNISTFLOW_EXTRAS:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
# torch first and pinned, so that resolving mnistflow's own range (torch>=2.4) never makes pip
# pick a torch: a bare 'torch' may resolve to a multi-GB CUDA build. A torch already in .venv
# (e.g. one installed from PyTorch's CPU index) is kept. Without an index, pip's own sources
# decide the build: this project's machines hold 2.13.0's CPU build; on Linux PyPI's is CUDA.
if ! python -c "import torch" 2>/dev/null; then
  pip install -q "torch==2.13.0" ${MNISTFLOW_TORCH_INDEX:+--index-url "$MNISTFLOW_TORCH_INDEX"} \
    2>&1 | grep -v '^WARNING: Location' || true
fi
# numpy with it: torch warns on import without it.
pip install -q numpy 2>&1 | grep -v '^WARNING: Location' || true
python -c "import torch" || { echo "scripts/setup.sh: torch failed to install" >&2; exit 1; }
pip install -q -e ".${extras:+[$extras]}" 2>&1 | grep -v '^WARNING: Location' || true
python -c "import mnistflow" || { echo "scripts/setup.sh: mnistflow failed to install" >&2; exit 1; }
