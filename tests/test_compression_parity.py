"""Parity of the built engine's compression (activekv._engine.encode_layer / decode_layer) with the
plain Python reference (reference/compression.py), bit for bit (engine/offload/SPEC.md §5).

Covers every dtype x mode on random raw words (every bit pattern class: NaN, inf, subnormals),
realistic values over a wide range of group scales, special groups (zeros, non-finite, one huge
value, exact ties), a dense sweep of all 65536 fp16 and bf16 patterns, decoding of arbitrary stored
bytes, the reference's negative controls (FAULTS must make the comparison fail), and the
ValueErrors for bad input.

The module under test comes from the `engine` fixture below (see its docstring for where).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from reference import compression as ref

REPO_ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("fp16", "bf16", "fp32")
MODES = ("exact", "int8", "fp8_e4m3")
COMPRESSED = ("int8", "fp8_e4m3")
WORDS = {"fp16": np.uint16, "bf16": np.uint16, "fp32": np.uint32}


@pytest.fixture(scope="session")
def engine(engine_module: ModuleType) -> ModuleType:
    """activekv._engine from the wheel under test (tests/conftest.py builds and installs it)."""
    return engine_module


# ---- helpers ----


def make_layout(
    engine: ModuleType, dtype: str, block_size: int, heads: int, head_dim: int
) -> object:
    return engine.KvBlockLayout(1, block_size, heads, head_dim, getattr(engine.KvDtype, dtype))


def first_difference(got: np.ndarray, want: np.ndarray) -> str:
    got = got.reshape(-1)
    want = want.reshape(-1)
    if got.shape != want.shape:
        return f"shapes differ: {got.shape} vs {want.shape}"
    index = int(np.flatnonzero(got != want)[0])
    count = int(np.count_nonzero(got != want))
    return (
        f"{count} of {got.size} differ; first at {index}: "
        f"engine {int(got[index]):#x}, reference {int(want[index]):#x}"
    )


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs {want.dtype}"
    if not np.array_equal(got, want):
        pytest.fail(f"{what}: {first_difference(got, want)}")


def count_differences(
    engine: ModuleType, layout: object, mode: str, k: np.ndarray, v: np.ndarray
) -> int:
    """Bytes / words in which the engine and the reference disagree (encode, then each side's
    decode of its own bytes)."""
    got = engine.encode_layer(layout, mode, k, v)
    want = ref.encode_layer(layout, mode, k, v)
    different = int(np.count_nonzero(got != want)) if got.shape == want.shape else got.size
    for got_words, want_words in zip(
        engine.decode_layer(layout, mode, got), ref.decode_layer(layout, mode, want), strict=True
    ):
        different += int(np.count_nonzero(got_words != want_words))
    return different


def check_parity(
    engine: ModuleType, layout: object, mode: str, k: np.ndarray, v: np.ndarray
) -> None:
    """encode_layer and decode_layer agree bit for bit; exact mode also round-trips the words."""
    got = engine.encode_layer(layout, mode, k, v)
    want = ref.encode_layer(layout, mode, k, v)
    assert got.shape == (ref.stored_layer_bytes(layout, mode),)
    assert_same(got, want, f"encode {layout!r} {mode}")
    got_k, got_v = engine.decode_layer(layout, mode, got)
    want_k, want_v = ref.decode_layer(layout, mode, want)
    assert_same(got_k, want_k, f"decode K {layout!r} {mode}")
    assert_same(got_v, want_v, f"decode V {layout!r} {mode}")
    if mode == "exact":
        assert_same(got_k, k, "exact K round trip")
        assert_same(got_v, v, "exact V round trip")


def random_words(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    word = WORDS[dtype]
    return rng.integers(0, np.iinfo(word).max, shape, dtype=word, endpoint=True)


def words_of(dtype: str, values: np.ndarray) -> np.ndarray:
    """float values -> raw words of dtype (values chosen exact in the dtype, or rounded by numpy /
    truncated for bf16, which is fine for test data)."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "fp32":
        return values.view(np.uint32).copy()
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).view(np.uint16)
    return (values.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def realistic_words(
    rng: np.random.Generator, dtype: str, shape: tuple[int, int, int]
) -> np.ndarray:
    """Normal values with one magnitude per group, from 2^-40 to 2^40 (subnormal fp16 and
    saturated ranges included)."""
    group_scale = np.exp2(rng.uniform(-40, 40, (*shape[:2], 1)))
    return words_of(dtype, rng.standard_normal(shape) * group_scale)


def grid_words(rng: np.random.Generator, dtype: str, shape: tuple[int, int, int]) -> np.ndarray:
    """Random multiples of 2^e / 2 per group with amax 127 * 2^e: int8's scale is 2^e exactly,
    so about half the elements are exact ties."""
    unit = np.exp2(rng.integers(-10, 10, (*shape[:2], 1)).astype(np.float64))
    values = rng.integers(-254, 255, shape) / 2 * unit
    values[..., 0] = 127 * unit[..., 0]
    return words_of(dtype, values)


# ---- the engine and the reference agree ----


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_random_raw_words(engine: ModuleType, dtype: str, mode: str) -> None:
    rng = np.random.default_rng(20240 + DTYPES.index(dtype) * 7 + MODES.index(mode))
    for block_size, heads, head_dim in ((16, 4, 64), (3, 5, 7), (1, 1, 1), (2, 2, 128)):
        layout = make_layout(engine, dtype, block_size, heads, head_dim)
        shape = (block_size, heads, head_dim)
        check_parity(
            engine, layout, mode, random_words(rng, dtype, shape), random_words(rng, dtype, shape)
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", COMPRESSED)
def test_realistic_values(engine: ModuleType, dtype: str, mode: str) -> None:
    rng = np.random.default_rng(777 + DTYPES.index(dtype))
    layout = make_layout(engine, dtype, 16, 8, 128)
    for _ in range(3):
        shape = (16, 8, 128)
        check_parity(
            engine,
            layout,
            mode,
            realistic_words(rng, dtype, shape),
            realistic_words(rng, dtype, shape),
        )


def special_groups(dtype: str, mode: str) -> np.ndarray:
    """[T, 1, 16] float32 values: one special group per token."""
    inf, nan = np.inf, np.nan
    e4m3 = ref._E4M3_VALUES.astype(np.float32)
    tiny = np.float32(2.0**-149) if dtype == "fp32" else np.float32(2.0**-24)
    groups = [
        np.zeros(16),
        np.full(16, -0.0),
        np.full(16, nan),
        np.array([inf, -inf] * 8),
        np.array([nan, inf, -inf, 0.0] * 4),
        np.array([60000.0, 1.0, -1.0, 0.5, 1e-3, -1e-4, 2.0**-20, 3.0] + [0.0] * 8),
        np.array([tiny, -tiny, 0.0, tiny] * 4),  # a scale that underflows (fp32) or is tiny
        np.array([448.0, -448.0, 1.0, 2.0**-9, -(2.0**-10), 2.0**-6, 416.0, 432.0] * 2),
        np.array([127.0, -127.0, 0.5, -0.5, 1.5, -1.5, 2.5, 126.5] * 2),
        np.array([nan, 7.0, -inf, -7.0, 0.0, -0.0, 3.5, -3.5] * 2),
    ]
    # Exact ties: amax 127 (scale 1) with k + 0.5 for int8, amax 448 (scale 1) with the midpoints
    # between neighbouring E4M3 values for fp8 (all exact in fp16 and bf16 too).
    if mode == "int8":
        halves = np.arange(-126.5, 127, 1.0)
        for start in range(0, halves.size, 15):
            groups.append(np.concatenate([[127.0], np.resize(halves[start : start + 15], 15)]))
    else:
        middles = (e4m3[:-1] + e4m3[1:]) / 2
        middles = np.concatenate([middles, -middles])
        for start in range(0, middles.size, 15):
            groups.append(np.concatenate([[448.0], np.resize(middles[start : start + 15], 15)]))
    return np.stack(groups).astype(np.float32)[:, None, :]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_special_groups(engine: ModuleType, dtype: str, mode: str) -> None:
    values = special_groups(dtype, mode)
    words = words_of(dtype, values)
    layout = make_layout(engine, dtype, words.shape[0], 1, 16)
    check_parity(engine, layout, mode, words, words[::-1].copy())


@pytest.mark.parametrize("dtype", ("fp16", "bf16"))
@pytest.mark.parametrize("mode", MODES)
def test_every_16_bit_pattern(engine: ModuleType, dtype: str, mode: str) -> None:
    """All 65536 patterns: in order as K (neighbouring patterns share a group), shuffled as V (each
    group mixes magnitudes, so every code range is reached)."""
    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    shuffled = np.random.default_rng(5).permutation(patterns)
    for head_dim in (64, 128):
        shape = (65536 // head_dim // 4, 4, head_dim)
        layout = make_layout(engine, dtype, *shape)
        check_parity(engine, layout, mode, patterns.reshape(shape), shuffled.reshape(shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", COMPRESSED)
def test_decode_of_arbitrary_stored_bytes(engine: ModuleType, dtype: str, mode: str) -> None:
    """decode_layer of bytes encode_layer never writes (code 0x7F, int8 -128, NaN / inf / negative
    / subnormal scales) is defined too, and agrees."""
    rng = np.random.default_rng(31 + DTYPES.index(dtype))
    layout = make_layout(engine, dtype, 8, 4, 32)
    elements, groups = 8 * 4 * 32, 8 * 4
    for _ in range(4):
        codes = rng.integers(0, 256, 2 * elements, dtype=np.uint8)
        raw_scales = rng.integers(0, 2**32, 2 * groups, dtype=np.uint32).view(np.float32)
        with np.errstate(over="ignore"):  # up to 2^130: inf scales too
            fair_scales = np.exp2(rng.uniform(-150, 130, 2 * groups)).astype(np.float32)
        scales = np.where(rng.random(2 * groups) < 0.5, raw_scales, fair_scales).astype("<f4")
        stored = np.concatenate([codes, scales.view(np.uint8)])
        for got, want, what in zip(
            engine.decode_layer(layout, mode, stored),
            ref.decode_layer(layout, mode, stored),
            "KV",
            strict=True,
        ):
            assert_same(got, want, f"decode {what} {dtype} {mode}")


def test_stored_block_bytes(engine: ModuleType) -> None:
    for dtype in DTYPES:
        for shape in ((32, 16, 8, 128), (1, 1, 1, 1), (3, 5, 7, 9)):
            layout = engine.KvBlockLayout(*shape, getattr(engine.KvDtype, dtype))
            plain = SimpleNamespace(
                num_layers=shape[0],
                block_size=shape[1],
                num_kv_heads=shape[2],
                head_dim=shape[3],
                dtype=dtype,
            )
            for mode in MODES:
                expected = engine.stored_block_bytes(layout, mode)
                assert ref.stored_block_bytes(layout, mode) == expected
                assert ref.stored_block_bytes(plain, mode) == expected
                zeros = np.zeros(shape[1:], WORDS[dtype])
                encoded = engine.encode_layer(layout, mode, zeros, zeros)
                assert encoded.size * shape[0] == expected


# ---- the reference itself ----


# Every float32 (and so every E4M3 value) is a whole multiple of 2**-149, float32's least
# subnormal: scaled by 2**149 they are integers, whose arithmetic is exact rational arithmetic.
_FLOAT32_EXPONENT = 149


def _scaled(value: float) -> int:
    """`value` times 2**149, exactly (an integer: `value` is a float32 or an E4M3 value)."""
    numerator, denominator = Fraction(value).as_integer_ratio()
    scale, rest = divmod(1 << _FLOAT32_EXPONENT, denominator)
    assert rest == 0, f"{value!r} is not a multiple of 2**-149"
    return numerator * scale


@functools.cache
def _e4m3_scaled() -> tuple[int, ...]:
    return tuple(_scaled(float(v)) for v in ref._E4M3_VALUES)


def exact_nearest_e4m3(value: float) -> int:
    """Nearest E4M3 magnitude code to |value| <= 448 in exact rational arithmetic, ties to even:
    every code is tried, on integers (the values scaled by 2**149), not on float64."""
    target = _scaled(value)
    candidates = [(abs(v - target), code % 2, code) for code, v in enumerate(_e4m3_scaled())]
    return min(candidates)[2]


def test_reference_e4m3_encoder_is_exact() -> None:
    """The reference's float64 brute force equals exact rational brute force: on every midpoint
    and its float32 neighbours, and on random float32 magnitudes over the whole range."""
    values = ref._E4M3_VALUES.astype(np.float32)
    middles = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    bits = middles.view(np.uint32)
    near = np.concatenate([bits - 1, bits, bits + 1]).view(np.float32)
    rng = np.random.default_rng(3)
    random = (np.exp2(rng.uniform(-30, 9, 3000)) * rng.uniform(1, 2, 3000)).astype(np.float32)
    subnormal = rng.integers(1, 2**23, 200, dtype=np.uint32).view(np.float32)
    sample = np.concatenate([near, random, subnormal, values, [0.0, 448.0]]).astype(np.float32)
    sample = np.minimum(sample, np.float32(448))
    got = ref._e4m3_magnitude_codes(sample)
    want = np.array([exact_nearest_e4m3(float(x)) for x in sample])
    assert np.array_equal(got, want), first_difference(got, want)


def test_reference_known_values() -> None:
    layout = SimpleNamespace(num_layers=1, block_size=1, num_kv_heads=1, head_dim=4, dtype="fp32")
    k = np.array([[[127.0, -63.5, 2.5, np.nan]]], dtype=np.float32).view(np.uint32)
    v = np.array([[[448.0, -1.0625, 1.1875, -0.0]]], dtype=np.float32).view(np.uint32)
    assert list(ref.encode_layer(layout, "int8", k, k)[:4]) == [127, 0xC0, 2, 0]  # -64 = 0xC0
    assert list(ref.encode_layer(layout, "fp8_e4m3", v, v)[:4]) == [0x7E, 0xB8, 0x3A, 0x80]
    assert ref._E4M3_DECODE[0x7E] == 448 and ref._E4M3_DECODE[0x01] == 2.0**-9
    assert np.isnan(ref._E4M3_DECODE[0x7F]) and np.isnan(ref._E4M3_DECODE[0xFF])
    bf16 = ref._narrow(
        "bf16",
        np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x7FC12345], np.uint32).view(np.float32),
    )
    assert list(bf16) == [0x3F80, 0x3F82, 0x7F80, 0x7FC0]


# ---- negative controls: a fault in the reference must be detected ----


@pytest.fixture
def faults() -> Iterator[set[str]]:
    assert not ref.FAULTS, "the reference's FAULTS must be empty outside this fixture"
    try:
        yield ref.FAULTS
    finally:
        ref.FAULTS.clear()


@pytest.mark.parametrize(
    ("fault", "mode"), [("int8_round_half_up", "int8"), ("fp8_ulp", "fp8_e4m3")]
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_faults_are_detected(
    engine: ModuleType, faults: set[str], fault: str, mode: str, dtype: str
) -> None:
    assert fault in ref.KNOWN_FAULTS
    values = special_groups(dtype, mode)
    words = words_of(dtype, values)
    layout = make_layout(engine, dtype, words.shape[0], 1, 16)
    assert count_differences(engine, layout, mode, words, words) == 0
    faults.add(fault)
    assert count_differences(engine, layout, mode, words, words) > 0, f"{fault} went undetected"
    # Also on random data. Random values rarely give an int8 tie (x / scale exactly k + 0.5:
    # with raw random words about 0 of 20 blocks of 16x4x64 in fp16 and fp32, 4 in bf16), so that
    # fault is shown on random half-integer grids whose scale is a power of two; fp8_ulp changes
    # nearly every code and shows on realistic values.
    rng = np.random.default_rng(11)
    shape = (16, 4, 64)
    big = make_layout(engine, dtype, *shape)
    make = grid_words if fault == "int8_round_half_up" else realistic_words
    k, v = make(rng, dtype, shape), make(rng, dtype, shape)
    assert count_differences(engine, big, mode, k, v) > 0, f"{fault} went undetected"
    faults.clear()
    assert count_differences(engine, big, mode, k, v) == 0


# ---- bad input ----


def bad_calls(module: object, layout: object) -> list[tuple[str, object]]:
    """(argument the message must name, call) for each bad input."""
    good = np.zeros((4, 2, 8), np.uint16)
    stored = np.zeros(2 * 64 + 2 * 8 * 4, np.uint8)
    # One byte past an element boundary, and every other element: never read in place.
    misaligned = np.zeros(good.nbytes + 1, np.uint8)[1:].view(np.uint16).reshape(good.shape)
    strided = np.zeros((4, 2, 16), np.uint16)[..., ::2]
    return [
        ("k", lambda: module.encode_layer(layout, "exact", misaligned, good)),
        ("v", lambda: module.encode_layer(layout, "int8", good, strided)),
        ("k", lambda: module.encode_layer(layout, "int8", good.view(np.float16), good)),
        ("k", lambda: module.encode_layer(layout, "int8", np.zeros((4, 2, 8), np.uint32), good)),
        ("v", lambda: module.encode_layer(layout, "int8", good, good.view(np.int16))),
        ("k", lambda: module.encode_layer(layout, "exact", np.zeros((4, 2, 9), np.uint16), good)),
        (
            "v",
            lambda: module.encode_layer(layout, "fp8_e4m3", good, np.zeros((2, 4, 8), np.uint16)),
        ),
        ("mode", lambda: module.encode_layer(layout, "fp8", good, good)),
        ("mode", lambda: module.decode_layer(layout, "int4", stored)),
        ("mode", lambda: module.stored_block_bytes(layout, "")),
        ("stored", lambda: module.decode_layer(layout, "int8", stored[:-1])),
        ("stored", lambda: module.decode_layer(layout, "exact", stored)),
        (
            "stored",
            lambda: module.decode_layer(layout, "fp8_e4m3", np.zeros(stored.size + 4, np.uint8)),
        ),
    ]


def gap_calls(module: object, layout: object) -> dict[str, tuple[str, object]]:
    """Bad input the reference rejects with a ValueError but the binding does not yet: an array of
    the wrong ndim is a nanobind TypeError, and a stored array of another integer dtype is
    converted to uint8 silently."""
    good = np.zeros((4, 2, 8), np.uint16)
    return {
        "k_2d": ("k", lambda: module.encode_layer(layout, "int8", good.reshape(8, 8), good)),
        "v_4d": ("v", lambda: module.encode_layer(layout, "int8", good, good[None])),
        "stored_2d": (
            "stored",
            lambda: module.decode_layer(layout, "int8", np.zeros((2, 96), np.uint8)),
        ),
        "stored_int8": (
            "stored",
            lambda: module.decode_layer(layout, "int8", np.zeros(192, np.int8)),
        ),
        "stored_uint16": (
            "stored",
            lambda: module.decode_layer(layout, "int8", np.zeros(192, np.uint16)),
        ),
    }


GAPS = ("k_2d", "v_4d", "stored_2d", "stored_int8", "stored_uint16")


@pytest.mark.parametrize("side", ["engine", "reference"])
def test_bad_input_raises_value_error(engine: ModuleType, side: str) -> None:
    layout = make_layout(engine, "bf16", 4, 2, 8)
    module = engine if side == "engine" else ref
    calls = bad_calls(module, layout)
    if side == "reference":
        calls += list(gap_calls(module, layout).values())
    for argument, call in calls:
        with pytest.raises(ValueError, match=rf"^{argument}: "):
            call()


@pytest.mark.parametrize("case", GAPS)
def test_bad_input_binding_gaps(engine: ModuleType, case: str) -> None:
    argument, call = gap_calls(engine, make_layout(engine, "bf16", 4, 2, 8))[case]
    with pytest.raises(ValueError, match=rf"^{argument}: "):
        call()
