"""KV caches laid out as vLLM 0.33.0 lays them out, without vLLM: one backing allocation for every
layer, the logical [L, B, H, N, C] (C in bytes: K's head_dim words, then V's) placed in memory by
a KVCacheLayout stride permutation, and one [B, H, N, C / word] view per layer of raw words.

The permutations are vLLM's (`vllm/v1/kv_cache_layout.py`, KVCacheLayout values);
tests/with_vllm checks them against vLLM's own allocate_kv_cache.
"""

from __future__ import annotations

import math

import numpy as np

# Logical axis per physical position, outermost first: [L, B, H, N, C] = (0, 1, 2, 3, 4).
KV_CACHE_LAYOUTS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


def byte_strides(layout: str, shape: tuple[int, ...]) -> list[int]:
    """Byte strides of the logical [L, B, H, N, C] `shape` (C in bytes) placed by `layout`."""
    strides = [0] * 5
    step = 1
    for axis in reversed(KV_CACHE_LAYOUTS[layout]):
        strides[axis] = step
        step *= shape[axis]
    return strides


def layer_views(
    layout: str, num_layers: int, num_blocks: int, heads: int, tokens: int, head_dim: int,
    word: np.dtype,
) -> list[np.ndarray]:  # fmt: skip
    """One writable [num_blocks, heads, tokens, 2 * head_dim] view of `word` per layer, over one
    zeroed backing buffer placed by `layout`."""
    word = np.dtype(word)
    shape = (num_layers, num_blocks, heads, tokens, 2 * head_dim * word.itemsize)
    backing = np.zeros(math.prod(shape), np.uint8)
    logical = np.lib.stride_tricks.as_strided(
        backing, shape, byte_strides(layout, shape), writeable=True
    )
    return [logical[layer].view(word) for layer in range(num_layers)]
