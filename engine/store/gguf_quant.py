"""GGUF tensor blocks -> MLX arrays, exactly.

GGUF Q4_1 and Q8_0 are block formats with 32 values per block. Both have an exact
MLX equivalent in affine quantization with group size 32 (w = scale * q + bias):

- Q4_1 block: f16 d, f16 m, 16 bytes of nibbles (value j in the low nibble of byte
  j, value j + 16 in the high nibble); w = d * q + m, so scale = d, bias = m.
- Q8_0 block: f16 d, 32 int8; w = d * q. With q' = q + 128 (unsigned), w = d * q' - 128 d,
  so scale = d and bias = -128 d, which float16 holds exactly (a power-of-two multiple).

Scales and biases keep the file's float16 values bit for bit (the converter may widen them
to float32, which is exact); nothing is re-quantized.
Float tensors (F32, F16, BF16) pass through unchanged. Anything else has no exact MLX
form and is refused rather than silently approximated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP_SIZE = 32

Q4_1 = "Q4_1"
Q8_0 = "Q8_0"
FLOAT_TYPES = {"F32": np.float32, "F16": np.float16, "BF16": None}
QUANT_BITS = {Q4_1: 4, Q8_0: 8}


@dataclass
class Quantized:
    """An MLX affine-quantized matrix: packed uint32 weight, float16 scales and biases."""

    weight: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int

    def take_rows(self, order: np.ndarray) -> Quantized:
        """Reorder output rows; exact, since groups run along the input dimension."""
        return Quantized(self.weight[order], self.scales[order], self.biases[order], self.bits)


def _blocks(raw: np.ndarray, rows: int, block_bytes: int) -> np.ndarray:
    """View a tensor's raw bytes as (rows, blocks per row, bytes per block)."""
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    if data.shape[1] % block_bytes:
        raise ValueError(f"row of {data.shape[1]} bytes is not a whole number of {block_bytes}-byte blocks")
    return data.reshape(rows, -1, block_bytes)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned codes (rows, cols) into uint32 words, lowest bits first, as MLX does."""
    rows, cols = q.shape
    per_word = 32 // bits
    q = q.astype(np.uint32).reshape(rows, cols // per_word, per_word)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    return np.bitwise_or.reduce(q << shifts, axis=2)


def q4_1_to_affine(raw: np.ndarray, rows: int) -> Quantized:
    """Convert Q4_1 blocks of a (rows, cols) matrix into MLX affine 4-bit."""
    blocks = _blocks(raw, rows, 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    nibbles = blocks[..., 4:20]
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(rows, -1)
    return Quantized(_pack(codes, 4), d, m, 4)


def q8_0_to_affine(raw: np.ndarray, rows: int) -> Quantized:
    """Convert Q8_0 blocks of a (rows, cols) matrix into MLX affine 8-bit."""
    blocks = _blocks(raw, rows, 34)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    signed = blocks[..., 2:34].copy().view(np.int8).reshape(rows, -1)
    codes = (signed.astype(np.int16) + 128).astype(np.uint8)
    return Quantized(_pack(codes, 8), d, (d * np.float16(-128)).astype(np.float16), 8)


def convert_quantized(type_name: str, raw: np.ndarray, rows: int) -> Quantized:
    """Convert one quantized GGUF tensor, or raise ValueError for a type without an exact form."""
    if type_name == Q4_1:
        return q4_1_to_affine(raw, rows)
    if type_name == Q8_0:
        return q8_0_to_affine(raw, rows)
    raise ValueError(f"GGUF tensor type {type_name} has no exact MLX equivalent")
