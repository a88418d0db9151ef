"""The policy gate: `auditwheel show` reports a policy no newer than the manifest's, the wheel's
tags claim no newer one, and no CUDA library is vendored or needed at load time.

Static cudart loads libcuda with dlopen, so a wheel that names a CUDA library in DT_NEEDED or
ships one under `activekv.libs/` would tie users to one CUDA install: both fail here.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from packaging.utils import parse_wheel_filename

from release.errors import GateError
from release.evidence import Evidence, write_evidence
from release.gates.contract import GateInputs, Judges, Runner
from release.manifest import Manifest
from release.util.elf import ELF_MAGIC, ElfReadError, dt_needed
from release.wheelset import WheelSet

# Every library of these families (libcudnn_ops, libnvinfer_plugin, libcusparseLt, libcufftw
# too): a prefix, whatever follows it.
_CUDA_LIBRARY = re.compile(
    r"^lib(cuda|cublas|cufft|curand|cusparse|cusolver|cupti|nvrtc|nvJitLink|nccl|cudnn|nvinfer|"
    r"nvToolsExt|nvonnxparser|nvparsers|nvblas|nvjpeg|npp|cufile|cudla|nvptxcompiler|nvvm|nvml|"
    r"nvidia-ml)"
)
_SHOWN_POLICY = re.compile(r'platform tag:\s*"((?:manylinux_(\d+)_(\d+)|linux)_\w+)"')
_TAG_GLIBC = re.compile(r"^manylinux_(\d+)_(\d+)_")
# PEP 600's aliases for the legacy tags that auditwheel still adds beside the PEP 600 ones.
_LEGACY_TAGS = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def tag_glibc(platform_tag: str) -> tuple[int, int] | None:
    """The glibc version a manylinux platform tag requires, or None for another kind of tag."""
    if match := _TAG_GLIBC.match(platform_tag):
        return int(match.group(1)), int(match.group(2))
    return _LEGACY_TAGS.get(platform_tag.split("_", 1)[0])


def shown_policy(wheel: Path) -> tuple[str, tuple[int, int] | None]:
    """The platform tag `auditwheel show` reports, and its glibc version (None: no manylinux)."""
    result = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True
    )
    text = " ".join((result.stdout + result.stderr).split())
    match = _SHOWN_POLICY.search(text)
    if result.returncode != 0 or match is None:
        raise GateError(f"{wheel}: auditwheel show gave no platform tag: {text[-800:]}")
    if match.group(2) is None:
        return match.group(1), None
    return match.group(1), (int(match.group(2)), int(match.group(3)))


def _cuda_references(wheel: Path) -> list[str]:
    """Vendored CUDA libraries, and CUDA libraries any ELF member needs (whatever its name: the
    loader goes by the bytes)."""
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if _CUDA_LIBRARY.match(Path(name).name):
                problems.append(f"{name}: a vendored CUDA library")
            with archive.open(name) as member:
                if member.read(4) != ELF_MAGIC:
                    continue
            try:
                needed = dt_needed(ELFFile(io.BytesIO(archive.read(name))))
            except (ELFError, ElfReadError) as error:
                problems.append(f"{name}: expected a readable ELF file; got {error}")
                continue
            problems += [f"{name}: needs {library} (expected static cudart)"
                         for library in needed if _CUDA_LIBRARY.match(library)]  # fmt: skip
    return problems


def judge_wheel(wheel: Path, declared: tuple[int, int]) -> tuple[dict[str, str], list[str]]:
    """Figures and problems of one wheel against the declared glibc."""
    tag, shown = shown_policy(wheel)
    problems: list[str] = []
    if shown is None:
        problems.append(
            f"auditwheel show reports {tag}: it needs a library outside every manylinux policy"
        )
    elif shown > declared:
        problems.append(f"auditwheel show reports {tag}, newer than the declared glibc {declared}")
    for wheel_tag in parse_wheel_filename(wheel.name)[3]:
        glibc = tag_glibc(wheel_tag.platform)
        if glibc is None:
            problems.append(f"platform tag {wheel_tag.platform} is not a manylinux tag")
        elif glibc > declared:
            problems.append(f"platform tag {wheel_tag.platform} is newer than the declared policy")
    problems += _cuda_references(wheel)
    return {"auditwheel_show": tag}, [f"{wheel.name}: {p}" for p in problems]


def run_policy_gate(manifest: Manifest, wheels: WheelSet, out_dir: Path) -> Evidence:
    declared = manifest.build.glibc
    figures: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for wheel in wheels:
        figures[wheel.name], found = judge_wheel(wheel.path, declared)
        problems += found
    evidence = Evidence(
        gate="policy",
        verdict="fail" if problems else "pass",
        artefacts=wheels.digests,
        figures={"declared": manifest.build.platform, "wheels": figures, "failures": problems},
        reason="; ".join(problems),
        tools={"auditwheel": version("auditwheel"), "pyelftools": version("pyelftools")},
    )
    write_evidence(out_dir, evidence)
    return evidence


class PolicyGate:
    name = "policy"
    runner: Runner = "cpu"
    judges = Judges.EVERY_WHEEL
    shared_file = None

    def run(self, inputs: GateInputs) -> Evidence:
        return run_policy_gate(inputs.manifest, inputs.wheels, inputs.out_dir)


GATE = PolicyGate()
