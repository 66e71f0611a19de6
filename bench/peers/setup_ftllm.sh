#!/usr/bin/env bash
# fastllm (`ftllm` 1.9.0, C++), a peer of bench/streaming_peers.py, in a venv of its own outside the project.
# Installed with --no-deps: its declared dependencies pull CUDA runtimes and triton it does not need on a CPU; it
# needs only what its CPU path imports (transformers for tokenizers, jinja2 for chat templates, pyreadline3).
#
#   bash bench/peers/setup_ftllm.sh [VENV (/work/peers/ftllm/venv)] [WHEELS (/tmp/peerwheels)]
#
# WHEELS: a folder holding ftllm-1.9.0-*.whl (`pip download --no-deps ftllm==1.9.0 -d WHEELS` fetches it); it is
# also searched for the other wheels, so a folder filled once builds the venv offline. Prints the line to export.
set -euo pipefail
VENV=${1:-/work/peers/ftllm/venv}
WHEELS=${2:-/tmp/peerwheels}
python3 -m venv "$VENV"
"$VENV/bin/pip" install --no-deps --find-links "$WHEELS" "ftllm==1.9.0"
"$VENV/bin/pip" install --find-links "$WHEELS" "transformers<5" "jinja2>=3.1" pyreadline3 pillow psutil
echo "export NIGHTSHIFT_FTLLM=$VENV/bin/ftllm"
