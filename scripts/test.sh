#!/usr/bin/env bash
# Install everything the test suite needs (Python packages, Debian's chromium for the
# browser test and gcc for the native kernels) and run the whole suite. The tests find the real
# MNIST themselves (tests/helpers/realdata.py): $MNISTFLOW_DATA, else ../shared/data/mnist when
# it exists, else mnistflow's cache, else a verified download into it. Extra arguments go to
# pytest, e.g. -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages: chromium (the browser test) and gcc (mnistflow's native CPU kernels).
if { ! command -v chromium >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; } \
    && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver gcc) >/dev/null 2>&1 \
    || echo "scripts/test.sh: could not install chromium and gcc; the browser and kernel tests will fail" >&2
fi
MNISTFLOW_EXTRAS="${MNISTFLOW_EXTRAS:-dev,onnx,serve,report}" bash scripts/setup.sh
. .venv/bin/activate
export MNISTFLOW_THREADS="${MNISTFLOW_THREADS:-1}"
# Two pytest workers (pytest-xdist): the tests run their CLI on 1 thread each
# ($MNISTFLOW_THREADS), so two keep a 2-core machine busy; MNISTFLOW_TEST_WORKERS=0 runs serially.
exec python -m pytest -q -n "${MNISTFLOW_TEST_WORKERS:-2}" "$@"
