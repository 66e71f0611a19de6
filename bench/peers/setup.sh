#!/usr/bin/env bash
# A peer of bench/streaming_peers.py in a venv of its own outside the project, versions pinned; none of it is a
# nightshift dependency.
#
#   bash bench/peers/setup.sh ftllm|nunspark|airllm [VENV (/work/peers/PEER/venv)] [WHEELS (/tmp/peerwheels)]
#
# WHEELS: a folder searched for wheels before the index (`pip download --no-deps ftllm==1.9.0 nunspark==0.13.0
# airllm==4.0.0 -d WHEELS` fills it); a folder holding every wheel builds the venv offline.
# - ftllm 1.9.0 (fastllm, C++): --no-deps, because its declared dependencies pull CUDA runtimes and triton it does not
#   use on a CPU; then what its CPU path imports (transformers for tokenizers, jinja2, pyreadline3, pillow).
# - nunspark 0.13.0 (MLX): says Apple-only but runs under mlx[cpu] on Linux.
# - airllm 4.0.0 (torch): a CPU torch (pip's find-links here; elsewhere add --extra-index-url
#   https://download.pytorch.org/whl/cpu), never a CUDA one; transformers < 5 (its loader uses names 5 removed).
set -euo pipefail
PEER=${1:?name a peer: ftllm, nunspark or airllm}
VENV=${2:-/work/peers/$PEER/venv}
WHEELS=${3:-/tmp/peerwheels}
case "$PEER" in
    ftllm) first=(--no-deps "ftllm==1.9.0"); rest=("transformers<5" "jinja2>=3.1" pyreadline3 pillow) ;;
    nunspark) first=("nunspark==0.13.0" "mlx[cpu]==0.32.*" "mlx-lm==0.32.*"); rest=() ;;
    airllm) first=("torch==2.13.0" "airllm==4.0.0" "transformers<5"); rest=() ;;
    *) echo "unknown peer '$PEER': choose ftllm, nunspark or airllm" >&2; exit 2 ;;
esac
python3 -m venv "$VENV"
"$VENV/bin/pip" install --find-links "$WHEELS" "${first[@]}"
"$VENV/bin/pip" install --find-links "$WHEELS" "${rest[@]}" psutil
echo "built $PEER in $VENV"
