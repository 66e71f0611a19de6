"""glibc's malloc as a streaming process sets it (engine/io/arenas.py), counted by glibc itself: the reader threads
share two arenas, and expert tensors are mapped alone, so a read expert's memory goes back to the system."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nightshift.engine.moe.reader import RECYCLE_BYTES

ROOT = Path(__file__).resolve().parents[1]

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


# A child process: the threshold fixed for a store's expert tensors (or not: "heap"), then what glibc does with an
# array of the store's largest tensor, allocated after a larger mapped chunk was freed (which raises
# glibc's own threshold when nothing fixed it), and after it is freed. MLX keeps no freed buffers here.
MAPPED = """
import json, sys
import nightshift.engine
import mlx.core as mx
import numpy as np
from bench.process_memory import malloc_figures
from nightshift.engine.io.arenas import map_expert_tensors
mx.set_cache_limit(0)
sizes = json.loads(sys.argv[2])
threshold = map_expert_tensors(sizes) if sys.argv[1] == "map" else None
later = [map_expert_tensors(more) for more in json.loads(sys.argv[3])]
big = mx.array(np.ones(4 << 20, dtype=np.uint8))
mx.eval(big)
del big
before = malloc_figures()
expert = mx.array(np.ones(max(sizes), dtype=np.uint8))
mx.eval(expert)
held = malloc_figures()
del expert
after = malloc_figures()
print(json.dumps({"threshold": threshold, "later": later, "mapped": held["mappings"] - before["mappings"],
                  "mapped_bytes": held["mapped"] - before["mapped"], "left": after["mappings"] - before["mappings"]}))
"""


def mapped(how: str, sizes: list[int], later: list[list[int]] = (), **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")} | env
    out = subprocess.run([sys.executable, "-c", MAPPED, how, json.dumps(sizes), json.dumps(list(later))],
                         env=environ, cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mmap threshold is Linux's")
def test_expert_tensors_are_mapped_alone_and_given_back_unless_the_user_set_the_threshold():
    sizes = [3456, 27648, 221184, 3456]  # the default model's expert tensors: only down_proj is 64 KiB or more
    try:
        heap = mapped("heap", sizes)
    except subprocess.CalledProcessError as exc:  # no mallinfo2: not glibc 2.33+
        pytest.skip(f"no glibc mallinfo2 here: {exc.stderr.strip()[-200:]}")
    assert heap["mapped"] == 0  # glibc's default: the freed 4 MiB chunk raised its threshold; the expert is heap
    fixed = mapped("map", sizes, [[131072, 4096], [500000], [1000]])
    assert fixed["threshold"] == 221184
    assert fixed["later"] == [131072, 131072, 131072]  # a later store lowers it, never raises it
    assert fixed["mapped"] == 1 and fixed["mapped_bytes"] >= 221184  # the expert tensor is a mapping of its own
    assert fixed["left"] == 0  # and freeing it unmapped it: the memory went back to the system
    assert mapped("map", [3456, 27648])["threshold"] is None  # no tensor worth a mapping: the heap's default
    assert mapped("map", sizes, MALLOC_MMAP_THRESHOLD_="131072")["threshold"] is None  # the user's setting rules
    assert mapped("map", sizes, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")["threshold"] is None


# A child process: the sparse default model streamed with a cache of a quarter of its experts, 16 tokens decoded;
# its tokens, the experts the cache holds, and glibc's mappings and MLX's buffer cache limit after decoding.
STREAMED = """
import json, sys
from pathlib import Path
from bench.process_memory import malloc_figures
from nightshift.engine.moe.held import held_bytes
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest
import mlx.core as mx
store = Path(sys.argv[1])
manifest = read_manifest(store)
model = open_model(store, stream=StreamSettings(cache_bytes=manifest.expert_bytes // 4))
tokens = [chunk.token for chunk in model.generate_tokens(list(range(100, 116)), max_tokens=16)]
cached = model.figures(settled=True).cache_used // held_bytes(manifest.layers[0])
print(json.dumps({"tokens": tokens, "cached": cached, "mappings": malloc_figures()["mappings"],
                  "mlx_cache_limit": mx.set_cache_limit(0)}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mmap threshold is Linux's")
def test_a_streamed_models_cached_experts_are_rows_of_a_slab_and_decode_the_same_tokens(sparse_store):
    store, _ = sparse_store

    def streamed(**env: str) -> dict:
        environ = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"} | env
        out = subprocess.run([sys.executable, "-c", STREAMED, str(store)], env=environ, cwd=ROOT,
                             capture_output=True, text=True, check=True)  # fmt: skip
        return json.loads(out.stdout)

    mapped, heap = streamed(), streamed(MALLOC_MMAP_THRESHOLD_=str(32 << 20))  # the user's: experts on the heap
    assert mapped["cached"] > 100
    # The cache holds its experts as rows of a slab (engine/moe/slab.py): a few large mappings whatever the
    # threshold, not one per cached expert's 221 KB down_proj (113-118 for 120 cached experts before the slab).
    assert max(mapped["mappings"], heap["mappings"]) < 0.5 * mapped["cached"]
    assert mapped["mlx_cache_limit"] == RECYCLE_BYTES  # the step's reads recycled, not mapped afresh
    assert mapped["tokens"] == heap["tokens"] and len(mapped["tokens"]) == 16
