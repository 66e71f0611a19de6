#!/usr/bin/env bash
# nunspark 0.13.0 (MLX), a peer of bench/streaming_peers.py, in a venv of its own outside the project. It says
# Apple-only but runs under mlx[cpu] on Linux; mlx-lm converts the 4-bit MLX copy it packs from.
#
#   bash bench/peers/setup_nunspark.sh [VENV (/work/peers/nunspark/venv)] [WHEELS (/tmp/peerwheels)]
#
# WHEELS: a folder holding nunspark-0.13.0-*.whl (`pip download --no-deps nunspark==0.13.0 -d WHEELS`).
set -euo pipefail
VENV=${1:-/work/peers/nunspark/venv}
WHEELS=${2:-/tmp/peerwheels}
python3 -m venv "$VENV"
"$VENV/bin/pip" install --find-links "$WHEELS" "nunspark==0.13.0" "mlx[cpu]==0.32.*" "mlx-lm==0.32.*" psutil
echo "export NIGHTSHIFT_NUNSPARK=$VENV/bin/nunspark"
