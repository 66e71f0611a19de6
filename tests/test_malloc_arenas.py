"""The stream's reader threads share two glibc malloc arenas (engine/io/arenas.py), counted by glibc itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A child process: optionally the cap, then 8 threads that each allocate (64 KiB: from an arena, below glibc's
# mmap threshold) at once; prints the cap's result and the arenas glibc reports (malloc_info's <heap> entries).
CHILD = """
import ctypes, sys, threading
from nightshift.engine.io.arenas import cap_malloc_arenas
capped = cap_malloc_arenas() if sys.argv[1] == "cap" else False
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.tmpfile.restype = ctypes.c_void_p
start, held = threading.Barrier(8), []
def allocate():
    start.wait()
    held.append(libc.malloc(65536))
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
out = ctypes.c_void_p(libc.tmpfile())
libc.malloc_info(0, out)
size = libc.ftell(out)
libc.rewind(out)
text = ctypes.create_string_buffer(size)
libc.fread(text, 1, size, out)
print(capped, text.raw.count(b"<heap nr="))
"""


def arenas(how: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    out = subprocess.run([sys.executable, "-c", CHILD, how], env=environ, capture_output=True, text=True, check=True)
    capped, count = out.stdout.split()
    return capped, int(count)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas are Linux's")
def test_reader_threads_share_two_arenas_unless_the_user_set_their_number():
    try:
        free = arenas("free")
    except subprocess.CalledProcessError as exc:  # no malloc_info: not glibc
        pytest.skip(f"no glibc malloc_info here: {exc.stderr.strip()[-200:]}")
    assert free[1] > 2  # glibc's default: an arena per thread that allocates at once
    assert arenas("cap") == ("True", 2)
    assert arenas("cap", MALLOC_ARENA_MAX="4")[0] == "False"  # the user's setting rules
