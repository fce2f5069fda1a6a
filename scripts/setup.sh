#!/usr/bin/env bash
# Set up mnistflow from scratch: a virtual environment in .venv with the CPU build of
# PyTorch 2.13 and the package (editable) with the extras named in $MNISTFLOW_EXTRAS.
# Usage: source-free; other scripts call it. Safe to run again (pip skips what is there).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${MNISTFLOW_EXTRAS:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
# torch first and pinned: a bare 'torch' may resolve to a multi-GB CUDA build (numpy with it:
# torch warns on import without it).
pip install -q "torch==2.13.0" numpy 2>&1 | grep -v '^WARNING: Location' || true
python -c "import torch" || { echo "scripts/setup.sh: torch failed to install" >&2; exit 1; }
pip install -q -e ".${extras:+[$extras]}" 2>&1 | grep -v '^WARNING: Location' || true
python -c "import mnistflow" || { echo "scripts/setup.sh: mnistflow failed to install" >&2; exit 1; }
