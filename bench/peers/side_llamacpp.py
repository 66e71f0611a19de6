"""llama.cpp's side of bench/streaming_peers.py and bench/peer_fair.py (run with the peer venv's python, the one
`bash bench/peer_setup.sh` builds): the GGUF in the job's `model` directory (its only model, or the first file of a
split one) read through mmap, llama.cpp's default and how its users run a model larger than their RAM; greedy over
the prompt's token ids (no chat template), or fed the job's `forced` ids in turn, `threads` threads. llama.cpp keeps
no expert cache: the page cache is its cache, held to the process's memory cgroup limit; `budget` is not used.
`logits_all`: without it these bindings (0.3.36) leave `scores` at zero here (every greedy token 0); a 16-token
prompt's extra rows of logits cost nothing that shows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from llama_cpp import Llama
from side import Clock, report, work


def model_file(directory: Path) -> Path:
    files = sorted(directory.glob("*-00001-of-*.gguf")) or sorted(directory.glob("*.gguf"))
    if len(files) != 1:
        raise SystemExit(f"{directory} holds {len(files)} candidate GGUF models; give a directory with one")
    return files[0]


def rss_anon() -> int:
    """This process's own memory now, without the model's mapped pages (the page cache it shares)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


def main() -> None:
    job = work()
    llm = Llama(model_path=str(model_file(Path(job["model"]))), n_ctx=len(job["prompt"]) + job["tokens"] + 8,
                n_threads=job["threads"], n_threads_batch=job["threads"], use_mmap=True, verbose=False, seed=0,
                logits_all=True)  # fmt: skip
    clock = Clock()
    llm.eval(job["prompt"])
    tokens: list[int] = []
    forced = job.get("forced")
    while True:
        tokens.append(forced[len(tokens)] if forced else int(np.argmax(llm.scores[llm.n_tokens - 1])))
        clock.token()
        if len(tokens) == job["tokens"]:
            break
        llm.eval([tokens[-1]])
    report(clock, [tokens], {"rss_anon_bytes": rss_anon()})


if __name__ == "__main__":
    main()
