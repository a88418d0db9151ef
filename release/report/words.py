"""Record keys as words for people: the figures' keys a gate writes (``shared_file``,
``decode_step_p99_us``) and the toolchain's, with readable labels for the known ones and any
other snake_case key spelled out, so no internal key reaches the summary or the report as is."""

from __future__ import annotations

import re

# Keys whose words are not just the key spelled out.
LABELS = {
    "auditwheel_show": "auditwheel show",
    "shared_file": "shared file",
    "carried_by": "carried by",
    "dispatch_sites": "dispatch sites",
    "frames_per_step": "Python frames per step",
    "code_objects_per_step": "code objects per step",
    "hooks_per_step": "hooks per step",
    "loads_verified": "loads verified",
    "decode_step_median_us": "decode step median (µs)",
    "decode_step_p99_us": "decode step p99 (µs)",
    "decode_step_pipelined_us": "decode step back to back (µs)",
    "steady_steps": "steady steps",
    "total_decode_steps": "decode steps in all",
    "warmup_seconds": "warm-up (s)",
    "warmup_allocations": "allocations during warm-up",
    "warmup_allocation_callbacks": "allocation calls during warm-up",
    "first_second_allocations": "allocations in the first second after seal",
    "first_second_steps": "steps in the first second after seal",
    "steady_violations": "steady-state violations",
    "control_violations": "control violations",
    "capture_control_enqueue_refused": "capture control: enqueues refused",
    "output_max_error": "largest output error",
    "engine_staging": "engine staging",
    "cuda_host_compiler": "CUDA host compiler",
    "cuda_h": "cuda.h",
    "cudart_static": "libcudart_static.a",
    "zig_target": "zig target",
}
# Words that are written otherwise inside a key.
_WORDS = {"gpu": "GPU", "cpu": "CPU", "cuda": "CUDA", "h2d": "H2D", "d2h": "D2H", "abi": "ABI",
          "id": "ID", "url": "URL", "sha256": "sha256", "python": "Python"}  # fmt: skip
# A last word that is a unit: "(µs)" after the other words.
_UNITS = {"us": "µs", "ms": "ms", "s": "s", "seconds": "s", "gbps": "GB/s", "bytes": "bytes",
          "mb": "MB"}  # fmt: skip
# snake_case: lower-case words joined by "_", each starting with a letter. Wheel and cell names
# ("activekv-0.1.0-….whl", "manylinux_2_28_x86_64") are names, not keys: they stay as they are.
_SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z][a-z0-9]*)+")


def words(key: str) -> str:
    """`key` as people read it: its label, else its snake_case words, else the key itself."""
    if key in LABELS:
        return LABELS[key]
    if not _SNAKE.fullmatch(key):
        return key
    parts = key.split("_")
    unit = _UNITS.get(parts[-1]) if len(parts) > 1 else None
    spelled = " ".join(_WORDS.get(part, part) for part in (parts[:-1] if unit else parts))
    return f"{spelled} ({unit})" if unit else spelled
