"""An independent float64 llama forward pass in numpy, straight from a GGUF file.

It reads the GGUF's tensors with the `gguf` package's dequantization, keeps llama.cpp's
rotary row layout and applies RoPE to interleaved pairs (the layout's own convention),
so it shares no code or layout decision with nightshift's converter. It is the exact
math the quantized weights define: the yardstick for both nightshift and llama.cpp.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


class Float64Llama:
    def __init__(self, path: Path):
        reader = gguf.GGUFReader(str(path))
        field = lambda key: reader.fields[key].contents()  # noqa: E731
        self.layers = field("llama.block_count")
        self.heads = field("llama.attention.head_count")
        self.kv_heads = field("llama.attention.head_count_kv")
        self.theta = field("llama.rope.freq_base")
        self.eps = field("llama.attention.layer_norm_rms_epsilon")
        self.w = {}
        for tensor in reader.tensors:
            shape = tuple(int(n) for n in reversed(tensor.shape))
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
            self.w[tensor.name] = values.astype(np.float64)

    def _norm(self, x: np.ndarray, weight: str) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * self.w[weight]

    def _rope(self, x: np.ndarray) -> np.ndarray:
        """Rotate interleaved pairs (2i, 2i+1) of each head by position * theta^(-2i/d)."""
        positions, _, dim = x.shape
        angles = np.arange(positions)[:, None] * self.theta ** (-np.arange(0, dim, 2) / dim)[None, :]
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def last_logits(self, ids: list[int]) -> np.ndarray:
        """Logits for the token after `ids`."""
        n = len(ids)
        x = self.w["token_embd.weight"][ids]
        hidden = x.shape[1]
        head_dim = hidden // self.heads
        group = self.heads // self.kv_heads
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for layer in range(self.layers):
            p = f"blk.{layer}."
            h = self._norm(x, p + "attn_norm.weight")
            q = self._rope((h @ self.w[p + "attn_q.weight"].T).reshape(n, self.heads, head_dim))
            k = self._rope((h @ self.w[p + "attn_k.weight"].T).reshape(n, self.kv_heads, head_dim))
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(n, self.kv_heads, head_dim)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim) + mask
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            attended = np.einsum("hqk,khd->qhd", scores, v).reshape(n, hidden)
            x = x + attended @ self.w[p + "attn_output.weight"].T
            h = self._norm(x, p + "ffn_norm.weight")
            gate, up = h @ self.w[p + "ffn_gate.weight"].T, h @ self.w[p + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ self.w[p + "ffn_down.weight"].T
        out = self.w.get("output.weight", self.w["token_embd.weight"])
        return self._norm(x[-1:], "output_norm.weight")[0] @ out.T
