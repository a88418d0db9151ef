"""Small, valid, pure-Python wheels for tests of the sign, publish and verify steps.

The wheels are deterministic: the same arguments give the same bytes (fixed zip timestamps), so a
"rebuild" with the same arguments is identical and one with a different ``salt`` is not.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from release.gates.citations import line_digest
from release.manifest import load_manifest
from release.util.paths import DEFAULT_MANIFEST
from release.wheelset import WheelSet

_DATE_TIME = (2020, 2, 2, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def build_wheel(
    dest_dir: Path,
    *,
    name: str = "activekv",
    version: str = "0.1.0",
    module: str = "_probe",
    module_text: str = "VALUE = 42\n",
    salt: str = "",
    tag: str = "py3-none-any",
) -> Path:
    """Write ``<name>-<version>-<tag>.whl`` holding ``<name>/<module>.py`` into ``dest_dir``.

    ``salt`` changes the module's bytes (as a comment) without changing its behaviour.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    dist_info = f"{name}-{version}.dist-info"
    source = module_text + (f"# build salt: {salt}\n" if salt else "")
    files: list[tuple[str, bytes]] = [
        (f"{name}/{module}.py", source.encode("utf-8")),
        (
            f"{dist_info}/METADATA",
            (
                "Metadata-Version: 2.1\n"
                f"Name: {name}\n"
                f"Version: {version}\n"
                "Summary: test fixture wheel\n"
                "Requires-Python: >=3.8\n"
            ).encode(),
        ),
        (
            f"{dist_info}/WHEEL",
            (
                "Wheel-Version: 1.0\n"
                "Generator: tests.fixtures_wheels\n"
                "Root-Is-Purelib: true\n"
                f"Tag: {tag}\n"
            ).encode(),
        ),
    ]
    return _write_wheel(dest_dir / f"{name}-{version}-{tag}.whl", dist_info, files)


def _write_wheel(path: Path, dist_info: str, files: list[tuple[str, bytes]]) -> Path:
    """Writes ``files`` plus a RECORD listing them into the wheel at ``path``."""
    record_lines = [f"{member},{_record_hash(data)},{len(data)}" for member, data in files]
    record_lines.append(f"{dist_info}/RECORD,,")
    files = [*files, (f"{dist_info}/RECORD", ("\n".join(record_lines) + "\n").encode("utf-8"))]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in files:
            info = zipfile.ZipInfo(member, date_time=_DATE_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return path


def build_files_wheel(
    dest_dir: Path,
    files: dict[str, bytes],
    *,
    name: str = "fakefw",
    version: str = "1.0",
    tag: str = "py3-none-any",
) -> Path:
    """Write ``<name>-<version>-<tag>.whl`` holding exactly ``files`` (plus its metadata) into
    ``dest_dir``: a stand-in for a framework wheel whose source lines shims cite."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    wheel = (
        f"Wheel-Version: 1.0\nGenerator: tests.fixtures_wheels\nRoot-Is-Purelib: true\nTag: {tag}\n"
    )
    members = [
        *files.items(),
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", wheel.encode()),
    ]
    return _write_wheel(dest_dir / f"{name}-{version}-{tag}.whl", dist_info, members)


# The fixture framework ``fakefw==1.0`` whose lines the test shims cite (tests/test_citations.py
# has the citation format's details).
FAKEFW_FILES = {
    "fakefw/base.py": (
        b"import abc\n"
        b"\n"
        b"class Base(abc.ABC):\n"
        b"    @abc.abstractmethod\n"
        b"    def hook(self, x):\n"
        b"        pass\n"
    ),
    "fakefw/caller.py": b"def run(connector, x):\n    return connector.hook(x)\n",
}


def fakefw_cite(path: str, line: int, version: str = "1.0", digest: str | None = None) -> str:
    """The citation of line ``line`` of FAKEFW_FILES[path] (``digest`` overrides its hash)."""
    text = FAKEFW_FILES[path].decode().splitlines()[line - 1]
    return f"# cites: fakefw=={version} {path}:{line} {digest or line_digest(text)}"


def fakefw_shim(**override: str) -> bytes:
    """A clean shim of fakefw (its code on lines 3-6); ``override`` replaces whole lines by their
    key (l1..l4)."""
    lines = {
        "l1": f"from fakefw.base import Base  {fakefw_cite('fakefw/base.py', 3)}",
        "l2": f"class Shim(Base):  {fakefw_cite('fakefw/base.py', 3)}",
        "l3": f"    def hook(self, x):  {fakefw_cite('fakefw/base.py', 5)}",
        "l4": f"        return x  {fakefw_cite('fakefw/caller.py', 2)}",
    }
    lines.update(override)
    body = "\n".join(lines.values())
    return f"# A shim of fakefw: comments and blank lines need no citation.\n\n{body}\n".encode()


def wheel_set(*wheels: Path) -> WheelSet:
    """`wheels` as the pipeline passes them to its gates (hashed, with the versions each serves
    under the repository's manifest)."""
    return WheelSet.from_files(load_manifest(DEFAULT_MANIFEST), list(wheels))
