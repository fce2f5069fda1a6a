#!/usr/bin/env bash
# Install mnistflow and train the tutorial's deep CNN on MNIST (the main job).
#   bash scripts/train_mnist.sh                      # recipe seed-cnn
#   RECIPE=fast bash scripts/train_mnist.sh          # the time-to-accuracy recipe
# Data: $MNISTFLOW_DATA (a folder with the four MNIST .gz files), else ../shared/data/mnist
# when present, else the cache, else a verified download.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
if [ -z "${MNISTFLOW_DATA:-}" ] && [ -d ../shared/data/mnist ]; then
  export MNISTFLOW_DATA="$PWD/../shared/data/mnist"
fi
mnistflow prep mnist --out data/mnist
mnistflow train --recipe "${RECIPE:-seed-cnn}" --data data/mnist "$@"
