"""Direct reads of one expert file held at a gate after their first chunk: a read-ahead caught part way."""

from __future__ import annotations

import threading

from nightshift.engine.moe import expert_files


class GatedReads:
    """Every direct read of a file whose path contains `path_part` returns its first chunk, then waits for `go`
    before each further chunk; abortable reads are read in chunks of `chunk` bytes."""

    def __init__(self, monkeypatch, path_part: str, chunk: int):
        self.started = threading.Event()
        self.go = threading.Event()
        real = expert_files.open_direct

        def gated(path):
            handle = real(path)
            if path_part not in str(path):
                return handle
            read_into = handle.read_into

            def slow(view, offset, length=None):
                if offset:
                    self.started.set()
                    assert self.go.wait(30), "the test never let the read go on"
                return read_into(view, offset, length)

            handle.read_into = slow
            return handle

        monkeypatch.setattr(expert_files, "open_direct", gated)
        monkeypatch.setattr(expert_files, "ABORT_CHUNK", chunk)
