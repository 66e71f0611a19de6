#!/usr/bin/env bash
# README command 1 from a clean clone of this repository's HEAD, each part timed (docs/results.md).
# pip's cache is off and the data dir is new, as on a fresh machine; prints the seconds per part, the load
# average before and after (the machine may be shared), the BLAS MLX used and the PDF's path.
#
#     bash bench/first_run.sh [WORK_DIR]
#     bash bench/without_system_blas.sh bash bench/first_run.sh [WORK_DIR]   # as without Debian's OpenBLAS
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
git clone -q "$repo" "$work/clone"
cd "$work/clone"
export PIP_NO_CACHE_DIR=1 NIGHTSHIFT_HOME="$work/home"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s.%N)
python3 -m venv .venv
.venv/bin/pip install -q -e '.[test]'
t1=$(date +%s.%N)
.venv/bin/nightshift model default
t2=$(date +%s.%N)
.venv/bin/nightshift review run month-end --now
t3=$(date +%s.%N)
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -c "import nightshift.engine, mlx.core; from nightshift.engine.cpu_blas import BLAS_IN_USE; print('BLAS:', BLAS_IN_USE)"
python3 -c "
t0, t1, t2, t3 = $t0, $t1, $t2, $t3
print(f'venv+pip install {t1 - t0:.1f} s; model default {t2 - t1:.1f} s; review run {t3 - t2:.1f} s; total {t3 - t0:.1f} s')"
