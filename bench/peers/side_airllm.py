"""AirLLM's side of bench/streaming_peers.py (run with the AirLLM venv's python): the HF checkpoint split into its
per-layer shards (once, into the model's folder `airllm-split`, before the clock starts; the bench drops those
files from the page cache with the rest), run on the CPU in the checkpoint's precision (config.json's `dtype` or
`torch_dtype`; float32 where it names none) with its next-layer prefetch and per-expert loading; no expert cache, so `budget` has no knob here and
only the process's memory limit applies. Greedy through transformers' generate, timed per token by a streamer."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from airllm import AutoModel
from side import Clock, report, work
from transformers.generation.streamers import BaseStreamer


class Stamps(BaseStreamer):
    """Stamps each generated token (the first `put` is the prompt)."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.prompt_seen = clock, False

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:
            self.clock.token()
        self.prompt_seen = True

    def end(self) -> None:
        pass


def main() -> None:
    job = work()
    torch.set_num_threads(job["threads"])
    config = json.loads((Path(job["model"]) / "config.json").read_text())
    dtype = getattr(torch, config.get("dtype") or config.get("torch_dtype") or "float32")
    model = AutoModel.from_pretrained(job["model"], device="cpu", dtype=dtype,
                                      layer_shards_saving_path=job["model"] + "/airllm-split")  # fmt: skip
    prompt = torch.tensor([job["prompt"]])
    clock = Clock()
    out = model.generate(prompt, max_new_tokens=job["tokens"], do_sample=False, use_cache=True,
                         streamer=Stamps(clock))  # fmt: skip
    tokens = [int(t) for t in out[0][prompt.shape[1] :]]
    report(clock, [tokens], {"expert_streaming": bool(getattr(model, "_expert_streaming", False))})


if __name__ == "__main__":
    main()
