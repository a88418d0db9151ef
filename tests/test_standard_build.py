"""The standard PEP 517 build path: `python -m build --wheel` (the frontend cibuildwheel runs
inside its containers, `build-frontend = "build"`) and `pip wheel .` (what a contributor types)
build with the host's compilers and no settings at all, the build requirements taken from
pyproject.toml in an isolated environment; the wheel imports and passes the payload gate. (Its
policy is the host's: the host g++ links against this machine's glibc, so only the hermetic
build reaches the manifest's manylinux policy.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_wheels import wheel_set

from release.builder.reproduce import snapshot
from release.gates.payload import run_payload_gate
from release.manifest import load_manifest
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.private_site import clean_pip_env, install_private

pytestmark = pytest.mark.integration  # compiles the engine and the bindings with the host g++


FRONTENDS = {
    "build": ("-m", "build", "--wheel", "--outdir"),
    "pip": ("-m", "pip", "wheel", "--no-deps", "--wheel-dir"),
}


@pytest.mark.parametrize("frontend", sorted(FRONTENDS))
def test_the_standard_build_needs_no_settings(tmp_path: Path, frontend: str) -> None:
    source = snapshot(REPO_ROOT, tmp_path / "src")  # what a checkout holds, nothing built
    dist = tmp_path / "dist"
    result = subprocess.run(
        [sys.executable, *FRONTENDS[frontend], str(dist), str(source)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = sorted(dist.glob("activekv-*.whl"))

    site = install_private(Path(sys.executable), wheel, tmp_path / "site")
    imported = subprocess.run(
        [sys.executable, "-I", "-c",
         f"import sys; sys.path.insert(0, {str(site)!r}); "
         "import json, activekv._engine, activekv._fabric, activekv._vllm; "
         "print(json.dumps(activekv._fabric.build_info()))"],
        env=clean_pip_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    info = json.loads(imported.stdout)
    manifest = load_manifest(DEFAULT_MANIFEST)
    archs = manifest.build.cuda.architectures  # from pyproject's defines, as nothing was passed
    assert info["cuda_architectures"] == ",".join(
        [f"{a}-real" for a in archs] + [f"{archs[-1]}-virtual"]
    )
    assert info["cxx_compiler"].startswith("GNU ")  # the host g++, not the hermetic zig

    cache = Path(os.environ.get("ACTIVEKV_CACHE_DIR") or REPO_ROOT / ".activekv" / "cache")
    evidence = run_payload_gate(manifest, wheel_set(wheel), tmp_path / "out", framework_cache=cache)
    assert evidence.verdict == "pass", evidence.reason
