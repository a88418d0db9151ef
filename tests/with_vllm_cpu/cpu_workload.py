"""The workload the CPU tests send, and the sizes that make it evict: shared by the offline
driver (cpu_llm_driver.py) and the OpenAI server test, so both see the same prompts.

Each request is one of four long prefixes (300 words, about 300 tokens: 9 full blocks of 32)
and 8 words of its own. vLLM's device KV cache gets 24 blocks, so after a few other prefixes one
is gone from it; ActiveKV's host pool gets room for POOL_BLOCKS blocks, fewer than the working
set (4 prefixes of 9 full blocks each, and each request's own), so the oldest prefix is gone
from the pool too, while the two before the newest still come back from it.
"""

from __future__ import annotations

import random

from cpu_tiny_model import WORDS

BLOCK_SIZE = 32
DEVICE_BLOCKS = 24
MAX_MODEL_LEN = 512
MAX_TOKENS = 16
PREFIX_WORDS = 300
PREFIXES = 4
# The prefix each request opens with, in order: each of the four once (cold), then prefixes 1, 2
# and 3 twice round, each last seen three requests before: gone from the device cache (it holds
# about two prompts; a hit finds at most its first 2 blocks there), still in the pool (room for
# about three prompts' blocks, least recently used out first). Prefix 0 comes last, with the three
# others used nine times since: evicted from both.
ORDER = (0, 1, 2, 3, 1, 2, 3, 1, 2, 3, 0)
# Slots in the host pool: fewer than the working set's 36 prefix blocks (4 x 9; each request
# stores a block or two of its own too), more than three prefixes (test_cpu_offline checks it).
POOL_BLOCKS = 34

# The tiny model's KV layout (cpu_tiny_model.py): 2 layers, 2 KV heads, head_dim 32, fp32.
LAYERS, KV_HEADS, HEAD_DIM, DTYPE_BYTES = 2, 2, 32, 4


def stored_block_bytes(mode: str, tp: int = 1) -> int:
    """Bytes one block takes in a worker's host pool, as the engine sizes a slot
    (engine/offload/compression.cpp, stored_layer_bytes): exact keeps K and V as they are
    (2 x 32 x 2 x 32 x 4 = 16 KiB a layer); int8 and fp8 keep one byte an element plus two
    floats (scale, offset) for each token's head of K and V (64 groups x 72 bytes a layer).
    With `tp` workers each holds KV_HEADS / tp of the heads, and its slots are that much smaller."""
    groups = BLOCK_SIZE * KV_HEADS // tp
    if mode == "exact":
        return LAYERS * 2 * groups * HEAD_DIM * DTYPE_BYTES
    return LAYERS * groups * (2 * HEAD_DIM + 2 * 4)


def pool_bytes(mode: str, tp: int = 1) -> int:
    """cpu_bytes for a pool of POOL_BLOCKS slots in `mode`: the same number of blocks in every
    mode, so compression does not enlarge the pool past the working set. cpu_bytes is each
    worker's pool; with the heads split over `tp` workers the same bytes would hold `tp` times
    the blocks (measured: at tp 2, 34 exact slots' bytes kept prefix 0 to the end)."""
    return POOL_BLOCKS * stored_block_bytes(mode, tp)


def words(seed: int, count: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(count))


def prompts() -> list[tuple[int, str]]:
    """(prefix index, prompt) for each request: the prefix, then 8 words of its own."""
    return [(p, words(p, PREFIX_WORDS) + " " + words(100 + i, 8)) for i, p in enumerate(ORDER)]


def transfer_config(mode: str, tp: int = 1) -> dict[str, object]:
    """The --kv-transfer-config naming ActiveKV's connector by its registered name (the wheel's
    `vllm.general_plugins` entry point registers it; no module path is needed)."""
    return {
        "kv_connector": "ActiveKVConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes": pool_bytes(mode, tp), "device": "cpu",
                                      "mode": mode},
    }  # fmt: skip
