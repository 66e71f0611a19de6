"""fastllm's side of bench/streaming_peers.py (run with the ftllm venv's python): experts read from disk with its
RAM cache of `budget` bytes (`--moe_device disk --moe_cpu_cache`), greedy, the prompt's token ids as given."""

from __future__ import annotations

from ftllm import llm
from ftllm.benchmark import _generation_args, _launch_raw_response
from ftllm.util import make_normal_llm_model, make_normal_parser
from side import Clock, report, work


def main() -> None:
    job = work()
    argv = [job["model"], "--device", "cpu", "--moe_device", "disk", "--moe_cpu_cache", str(job["budget"])]
    argv += ["-t", str(job["threads"]), "--dtype", job.get("dtype", "auto"), "--temperature", "0"]
    parser = make_normal_parser("streaming peers: fastllm side")
    parser.add_argument("--temperature", type=float)
    for name in ("top_p", "top_k", "repeat_penalty"):
        parser.add_argument("--" + name, default=None)
    args = parser.parse_args(argv)
    model = make_normal_llm_model(args)
    greedy = _generation_args(model, args)
    clock = Clock()
    handles = [_launch_raw_response(model, job["prompt"], job["tokens"], greedy) for _ in range(job["width"])]
    tokens: list[list[int]] = [[] for _ in handles]
    live = set(range(len(handles)))
    while live:
        for i in list(live):
            token = llm.fastllm_lib.fetch_response_llm_model(model.model, handles[i])
            if token <= -1:
                live.discard(i)
                continue
            tokens[i].append(int(token))
            clock.token()
    report(clock, tokens, llm.get_disk_moe_cache_stats())


if __name__ == "__main__":
    main()
