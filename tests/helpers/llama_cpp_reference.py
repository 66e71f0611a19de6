"""Greedy decoding with llama.cpp (llama-cpp-python), run in whichever interpreter has it.

Usage: python llama_cpp_reference.py GGUF < request.json > answer.json
request: {"prompts": [{"ids": [...], "text": "...", "max_tokens": N}, ...]}
answer:  per prompt, llama.cpp's tokenization of `text`, its greedy token ids, and at each
step the two highest logits with their token ids (to judge near-ties).
Kept free of nightshift imports so it runs outside nightshift's environment.
"""

import json
import sys

import numpy as np
from llama_cpp import Llama


def greedy(llm: Llama, ids: list, max_tokens: int, eos: int) -> tuple[list, list]:
    llm.reset()
    llm.eval(ids)
    tokens, top2 = [], []
    for _ in range(max_tokens):
        logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        first, second = np.argsort(logits)[::-1][:2]
        tokens.append(int(first))
        top2.append([[int(first), float(logits[first])], [int(second), float(logits[second])]])
        if first == eos:
            break
        llm.eval([int(first)])
    return tokens, top2


def main() -> None:
    request = json.load(sys.stdin)
    llm = Llama(model_path=sys.argv[1], n_ctx=2048, logits_all=True, verbose=False, n_threads=2, seed=0)
    answers = []
    for prompt in request["prompts"]:
        tokens, top2 = greedy(llm, prompt["ids"], prompt["max_tokens"], llm.token_eos())
        tokenized = llm.tokenize(prompt["text"].encode(), add_bos=False, special=True)
        answers.append({"tokens": tokens, "top2": top2, "tokenized": tokenized})
    json.dump({"answers": answers}, sys.stdout)


if __name__ == "__main__":
    main()
