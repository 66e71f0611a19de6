#!/usr/bin/env bash
# AirLLM 4.0.0 (torch), a peer of bench/streaming_peers.py, in a venv of its own outside the project: layer at a
# time from a split copy of the model, no expert cache. torch: a CPU build (pip's find-links here; elsewhere add
# --extra-index-url https://download.pytorch.org/whl/cpu), never a CUDA one; transformers < 5 (AirLLM's loader
# uses names transformers 5 removed).
#
#   bash bench/peers/setup_airllm.sh [VENV (/work/peers/airllm/venv)] [WHEELS (/tmp/peerwheels)]
set -euo pipefail
VENV=${1:-/work/peers/airllm/venv}
WHEELS=${2:-/tmp/peerwheels}
python3 -m venv "$VENV"
"$VENV/bin/pip" install --find-links "$WHEELS" "torch==2.13.0" "airllm==4.0.0" "transformers<5" psutil
echo "export NIGHTSHIFT_AIRLLM_PYTHON=$VENV/bin/python"
