#!/usr/bin/env bash
# Runs a command as on a machine without Debian's OpenBLAS (libopenblas0-pthread) and the Fortran runtime
# that comes with it (libgfortran5): in a private mount namespace, an empty tmpfs over the OpenBLAS folder
# and an empty file over libgfortran, so the loader finds neither. Needs unshare(1) and the right to mount
# (root); says why and exits 1 otherwise. Nothing outside the command sees a change.
#
#     bash bench/without_system_blas.sh CMD [ARGS...]
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: bash bench/without_system_blas.sh CMD [ARGS...]" >&2; exit 2; }
lib="/usr/lib/$(uname -m)-linux-gnu"
# shellcheck disable=SC2016  # expanded by the inner shell, inside the namespace
exec unshare --mount --propagation private -- bash -c '
    set -euo pipefail
    lib=$1; shift
    if [ -d "$lib/openblas-pthread" ]; then mount -t tmpfs -o size=4k,mode=755 empty "$lib/openblas-pthread"; fi
    for file in "$lib"/libgfortran.so.5*; do
        if [ -f "$file" ] && [ ! -L "$file" ]; then mount --bind /dev/null "$file"; fi
    done
    exec "$@"' hide "$lib" "$@"
