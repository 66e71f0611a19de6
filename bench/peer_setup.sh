#!/usr/bin/env bash
# The peer of `nightshift bench peer`, built from PyPI: a venv with llama-cpp-python (llama.cpp compiled here from
# the sdist, CPU only) and what llama.cpp's own converter needs (torch, transformers, sentencepiece, the sdist's
# gguf-py). Benchmark only: none of it is a nightshift dependency, nothing of llama.cpp is kept in this repository.
#
#   bash bench/peer_setup.sh [VENV (./peer-venv)] [WORK (a new temporary directory: the sdist, unpacked)]
#
# Takes 10-40 minutes on 2 cores. torch: a CPU build (here the one in pip's find-links; elsewhere add
# --index-url https://download.pytorch.org/whl/cpu), never a CUDA one. Prints the two variables to export.
set -euo pipefail
VENV=${1:-$PWD/peer-venv}
WORK=${2:-$(mktemp -d)}
VERSION=0.3.36
python3 -m venv "$VENV"
"$VENV/bin/pip" download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$WORK"
tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    nice -n 19 "$VENV/bin/pip" install "$WORK/llama_cpp_python-$VERSION.tar.gz"
nice -n 19 "$VENV/bin/pip" install torch==2.13.0 "numpy<2.3" sentencepiece transformers "protobuf<5" \
    "$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp/gguf-py"
echo "export NIGHTSHIFT_LLAMA_CPP_PYTHON=$VENV/bin/python"
echo "export NIGHTSHIFT_LLAMA_CPP_SOURCE=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
