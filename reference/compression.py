"""Plain Python reference of the KV compression numerics (engine/offload/SPEC.md §5).

Written to be obviously correct rather than fast, and independently of the C++ code
(engine/offload/compression.cpp, float_bits.h): float32 arithmetic is numpy float32 arithmetic
(each operation one IEEE binary32 operation, round to nearest even), the E4M3 encoder picks the
nearest of the 127 non-negative finite E4M3 values by brute force, fp16 narrowing is numpy's
``astype(np.float16)``, bf16 narrowing an explicit round-to-nearest-even on the float32 bits.

API as SPEC.md §7: ``stored_block_bytes``, ``encode_layer``, ``decode_layer``. ``layout`` is any
object with ``num_layers``, ``block_size``, ``num_kv_heads``, ``head_dim`` and ``dtype`` ("fp16",
"bf16", "fp32", or an enum whose ``.name`` is one of those, like the binding's ``KvDtype``).

``FAULTS`` is for the parity gate's negative control only (never set it otherwise):
``"int8_round_half_up"`` rounds int8 ties away from zero instead of to even; ``"fp8_ulp"`` adds one
to the magnitude of every nonzero E4M3 code before saturation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MODES = ("exact", "int8", "fp8_e4m3")
KNOWN_FAULTS = frozenset({"int8_round_half_up", "fp8_ulp"})
FAULTS: set[str] = set()

# Raw word type of each dtype.
WORDS = {"fp16": np.dtype(np.uint16), "bf16": np.dtype(np.uint16), "fp32": np.dtype(np.uint32)}
# What a NaN product is written as when decoding (only bytes that encode_layer never writes, such
# as code 0x7F or a NaN scale, produce one): the dtype's canonical quiet NaN.
_CANONICAL_NAN = {"fp16": 0x7E00, "bf16": 0x7FC0, "fp32": 0x7FC0_0000}

_INT8_MAX = np.float32(127.0)
_E4M3_MAX = np.float32(448.0)
_E4M3_MAX_CODE = 0x7E


def _e4m3_value(code: int) -> float:
    """Exact value of an E4M3FN code (OCP FP8: bias 7, 3 mantissa bits); NaN for 0x7F/0xFF."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent = (code >> 3) & 0xF
    mantissa = code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * (mantissa / 8) * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


# The 127 non-negative finite E4M3 values, index = code (float64 holds them exactly).
_E4M3_VALUES = np.array([_e4m3_value(code) for code in range(_E4M3_MAX_CODE + 1)])
# The decoded value of every code as float32 (exact: at most 4 significant bits).
_E4M3_DECODE = np.array([_e4m3_value(code) for code in range(256)], dtype=np.float32)


def dtype_name(layout: Any) -> str:
    dtype = layout.dtype
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None)
    if name not in WORDS:
        raise ValueError(f"layout.dtype: expected fp16, bf16 or fp32; got {dtype!r}")
    return name


def check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f'mode: expected "exact", "int8" or "fp8_e4m3"; got "{mode}"')
    return mode


def _groups(layout: Any) -> int:
    return layout.block_size * layout.num_kv_heads


def _elements(layout: Any) -> int:
    return _groups(layout) * layout.head_dim


def stored_layer_bytes(layout: Any, mode: str) -> int:
    """Bytes of one layer of one block in the host pool (K and V)."""
    name = dtype_name(layout)
    if check_mode(mode) == "exact":
        return 2 * _elements(layout) * WORDS[name].itemsize
    return 2 * _elements(layout) + 2 * _groups(layout) * 4


def stored_block_bytes(layout: Any, mode: str) -> int:
    """Bytes of one block (all layers): the host pool's slot size."""
    return stored_layer_bytes(layout, mode) * layout.num_layers


def checked_layout_in_memory(array: np.ndarray, name: str) -> None:
    """SPEC.md §1: arrays are C-contiguous and aligned to their elements (never copied to make
    them so); ValueError naming ``name`` otherwise."""
    if not array.flags.c_contiguous:
        strides = [stride // array.itemsize for stride in array.strides]
        raise ValueError(
            f"{name}: expected a C-contiguous array; got strides {strides} (in elements) "
            f"for shape {list(array.shape)}"
        )
    checked_alignment(array, name, array.itemsize)


def checked_alignment(array: np.ndarray, name: str, element_bytes: int) -> None:
    """ValueError naming ``name`` unless ``array`` starts at a multiple of ``element_bytes``."""
    offset = array.ctypes.data % element_bytes
    if offset:
        raise ValueError(
            f"{name}: expected an array aligned to its {element_bytes}-byte elements; got one "
            f"that starts {offset} byte(s) past such a boundary"
        )


def _check_words(layout: Any, name: str, words: Any, arg: str) -> np.ndarray:
    shape = (layout.block_size, layout.num_kv_heads, layout.head_dim)
    word = WORDS[name]
    if not isinstance(words, np.ndarray) or words.dtype != word:
        got = words.dtype if isinstance(words, np.ndarray) else type(words).__name__
        raise ValueError(f"{arg}: expected raw words ({word.name}) of dtype {name}; got {got}")
    if words.shape != shape:
        raise ValueError(
            f"{arg}: expected shape [block_size, num_kv_heads, head_dim] = {list(shape)}; "
            f"got {list(words.shape)}"
        )
    checked_layout_in_memory(words, arg)
    return words


# ---- float conversions ----


def _widen(name: str, words: np.ndarray) -> np.ndarray:
    """Raw words -> float32 values, exactly."""
    if name == "fp32":
        return words.view(np.float32)
    if name == "fp16":
        return words.view(np.float16).astype(np.float32)
    return (words.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _narrow(name: str, values: np.ndarray) -> np.ndarray:
    """float32 values -> raw words, round to nearest even; NaN -> the canonical quiet NaN."""
    if name == "fp32":
        words = values.view(np.uint32).copy()
    elif name == "fp16":
        with np.errstate(over="ignore"):  # overflow to ±inf is the rule
            words = values.astype(np.float16).view(np.uint16)
    else:
        bits = values.view(np.uint32).astype(np.uint64)
        lowest_kept = (bits >> np.uint64(16)) & np.uint64(1)
        # Round to nearest even: add just under half, plus one more when the kept part is odd.
        rounded = (bits + np.uint64(0x7FFF) + lowest_kept) >> np.uint64(16)
        words = (rounded & np.uint64(0xFFFF)).astype(np.uint16)
    canonical = np.array(_CANONICAL_NAN[name], dtype=words.dtype)
    return np.where(np.isnan(values), canonical, words)


# ---- quantizers ----


def _int8_codes(y: np.ndarray) -> np.ndarray:
    """round_half_even(y) clamped to [-127, 127], as int8; y is float32 without NaN."""
    y = np.clip(y, -_INT8_MAX, _INT8_MAX)  # ±inf saturates
    truncated = np.trunc(y)
    fraction = np.abs(y - truncated)  # exact: the low bits of y
    odd = np.fmod(truncated, np.float32(2)) != 0
    if "int8_round_half_up" in FAULTS:
        away = fraction >= np.float32(0.5)
    else:
        away = (fraction > np.float32(0.5)) | ((fraction == np.float32(0.5)) & odd)
    rounded = truncated + np.where(away, np.sign(y), np.float32(0))
    return rounded.astype(np.int8)


def _e4m3_magnitude_codes(magnitude: np.ndarray) -> np.ndarray:
    """Code (0..0x7E) of the E4M3 value nearest to each magnitude (0 <= m <= 448), ties to the
    even code, by brute force over all 127 candidates.

    The distances are computed in float64. The distances to the two neighbours of m are exact
    there (a float32 and a 4-bit value near it differ by a number of at most ~25 significant bits,
    or m itself, near 0); every other candidate is farther by at least one E4M3 step, far more
    than float64 rounding could take away. So the minimum and its ties are the exact ones.
    """
    codes = np.empty(magnitude.shape, dtype=np.int64)
    parity = np.arange(_E4M3_VALUES.size) % 2
    chunk = 4096
    for start in range(0, magnitude.size, chunk):
        m = magnitude[start : start + chunk].astype(np.float64)
        distance = np.abs(_E4M3_VALUES[None, :] - m[:, None])
        nearest = distance == distance.min(axis=1, keepdims=True)
        # Among the nearest (one, or two neighbours of which one is even) take the even code.
        codes[start : start + chunk] = np.argmin(np.where(nearest, parity, 2), axis=1)
    return codes


def _e4m3_codes(y: np.ndarray) -> np.ndarray:
    """E4M3 codes of float32 y (no NaN): nearest, ties to even, |y| > 448 saturates to ±448,
    sign bit = the sign of y (so -0 and negatives that round to zero give 0x80)."""
    magnitude = np.minimum(np.abs(y), _E4M3_MAX).reshape(-1)  # ±inf saturates
    codes = _e4m3_magnitude_codes(magnitude)
    if "fp8_ulp" in FAULTS:
        codes = np.where(codes != 0, codes + 1, codes)
    codes = np.minimum(codes, _E4M3_MAX_CODE)
    sign = np.where(np.signbit(y.reshape(-1)), 0x80, 0)
    return (codes | sign).astype(np.uint8).reshape(y.shape)


def _encode_tensor(name: str, mode: str, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One tensor [T, H, D] -> (codes as uint8 [T, H, D], scales as float32 [T, H])."""
    x = _widen(name, words)
    finite = np.isfinite(x)
    amax = np.where(finite, np.abs(x), np.float32(0)).max(axis=-1)
    scale = amax / (_INT8_MAX if mode == "int8" else _E4M3_MAX)
    assert scale.dtype == np.float32
    # Elements that get a computed code: not NaN, in a group whose scale is not zero.
    computed = ~np.isnan(x) & (scale[..., None] != 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y = x / scale[..., None]  # float32 division; ±inf stays ±inf
    y = np.where(computed, y, np.float32(0))
    assert y.dtype == np.float32
    if mode == "int8":
        codes = _int8_codes(y).view(np.uint8)
    else:
        codes = _e4m3_codes(y)
    return np.where(computed, codes, np.uint8(0)), scale


def _decode_tensor(name: str, mode: str, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    if mode == "int8":
        decoded = codes.view(np.int8).astype(np.float32)
    else:
        decoded = _E4M3_DECODE[codes]
    with np.errstate(over="ignore", invalid="ignore"):
        values = decoded * scale[..., None]  # float32 multiply
    assert values.dtype == np.float32
    return _narrow(name, values)


def encode_layer(layout: Any, mode: str, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One layer of one block (K and V raw words [T, H, D]) -> its stored bytes (uint8)."""
    mode = check_mode(mode)
    name = dtype_name(layout)
    k = _check_words(layout, name, k, "k")
    v = _check_words(layout, name, v, "v")
    if mode == "exact":
        return np.concatenate([k.reshape(-1).view(np.uint8), v.reshape(-1).view(np.uint8)])
    k_codes, k_scales = _encode_tensor(name, mode, k)
    v_codes, v_scales = _encode_tensor(name, mode, v)
    parts = [
        k_codes.reshape(-1),
        v_codes.reshape(-1),
        k_scales.astype("<f4").reshape(-1).view(np.uint8),
        v_scales.astype("<f4").reshape(-1).view(np.uint8),
    ]
    return np.concatenate(parts)


def decode_layer(layout: Any, mode: str, stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stored bytes of one layer of one block -> (K, V) raw words [T, H, D]."""
    mode = check_mode(mode)
    name = dtype_name(layout)
    expected = stored_layer_bytes(layout, mode)
    if not isinstance(stored, np.ndarray) or stored.dtype != np.uint8 or stored.ndim != 1:
        raise ValueError("stored: expected a 1-D uint8 array")
    if stored.size != expected:
        raise ValueError(f"stored: expected {expected} bytes; got {stored.size}")
    shape = (layout.block_size, layout.num_kv_heads, layout.head_dim)
    word = WORDS[name]
    if mode == "exact":
        half = expected // 2
        k = stored[:half].copy().view(word).reshape(shape)
        v = stored[half:].copy().view(word).reshape(shape)
        return k, v
    elements = _elements(layout)
    groups = _groups(layout)
    k_codes = stored[:elements].reshape(shape)
    v_codes = stored[elements : 2 * elements].reshape(shape)
    scales = stored[2 * elements :].copy().view("<f4").astype(np.float32)
    k_scales = scales[:groups].reshape(shape[:2])
    v_scales = scales[groups:].reshape(shape[:2])
    return _decode_tensor(name, mode, k_codes, k_scales), _decode_tensor(
        name, mode, v_codes, v_scales
    )
