"""What a signature and a verify depend on, as the inputs of their reuse keys (docs/reuse.md),
and the stored results they give back.

* A signature: the statement's content (every field but ``runDetails.metadata``: the invocation's
  id and the build's clock, which differ on every run while what is signed does not) and the
  key that signs it. What is reused is the stored envelope, verified again with that key.
* A verify's installs: the index (the embedded one by its folder, whatever port it has today; a
  remote one by its URL, credentials masked), every file it serves for the version with its
  sha256 (checked against the statement and TUF this run, before the key is taken), the TUF
  metadata trusted after this run's refresh and the root it started from, the stored
  statement's sha256, each interpreter installed into (asked what it is and holds), the modules
  imported, and the code of verify.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from securesystemslib.signer import Key, Signer

from release.errors import ReleaseError, SigningError, VerifyError
from release.manifest import NetworkLimits
from release.statement import Statement
from release.trust.index import EmbeddedIndex
from release.trust.remote_index import RemoteIndex
from release.trust.served_files import check_served_files
from release.trust.sign import read_and_verify_envelope, sign_to
from release.trust.tuf_client import TrustedIndex
from release.trust.tuf_metadata import TufRepository
from release.trust.verify import InstallCheck, Verification, verify_from_index
from release.util import tool_facts
from release.util.atomic import atomic_write
from release.util.digests import sha256_file
from release.util.progress import console
from release.util.reuse import ReuseStore, reuse_key
from release.util.sources import module_sources
from release.util.urls import masked_url

_VERIFY_MODULES = ("release.trust.verify", "release.trust.steps")


def statement_key_inputs(statement: Mapping[str, Any], keyid: str) -> dict[str, Any]:
    """The statement as its signature's key holds it (runDetails.metadata left out), and the key
    that signs it."""
    content = copy.deepcopy(dict(statement))
    content.get("predicate", {}).get("runDetails", {}).pop("metadata", None)
    return {"statement": content, "signer": keyid}


def tuf_metadata(cache_dir: Path) -> dict[str, str]:
    """The TUF metadata a consumer trusts after its refresh (its cache folder), by file."""
    return {path.name: sha256_file(path) for path in sorted(cache_dir.glob("*.json"))}


def verify_key_inputs(
    *,
    index: str,
    served: Mapping[str, str],
    tuf_cache: Path,
    trusted_root: Path,
    statement: Path,
    interpreters: Sequence[Path],
    imports: Sequence[str],
) -> dict[str, Any]:
    return {
        "index": index,
        "served": dict(sorted(served.items())),
        "tuf": {"metadata": tuf_metadata(tuf_cache), "root": sha256_file(trusted_root)},
        "statement": sha256_file(statement),
        "interpreters": tool_facts.interpreters(interpreters),
        "imports": list(imports),
        "code": module_sources(_VERIFY_MODULES),
        "tools": {
            "running": tool_facts.running_interpreter(),
            "environment": tool_facts.environment(),
        },
    }


def checks_payload(checks: Sequence[InstallCheck]) -> dict[str, Any]:
    return {"checks": [{"interpreter": str(c.interpreter), "python_version": c.python_version,
                        "wheel": c.wheel, "sha256": c.sha256, "digest_ok": c.digest_ok,
                        "imported": list(c.imported)} for c in checks]}  # fmt: skip


def stored_checks(
    payload: Mapping[str, Any], served: Mapping[str, str], interpreters: Sequence[Path]
) -> tuple[InstallCheck, ...] | None:
    """The install checks a stored verify made, one per interpreter of this run, each of a file
    served now with its digest; None for an entry that does not hold exactly that."""
    entries = payload.get("checks")
    if not isinstance(entries, list) or len(entries) != len(interpreters):
        return None
    checks = []
    for entry, interpreter in zip(entries, interpreters, strict=True):
        try:
            check = InstallCheck(
                interpreter=Path(entry["interpreter"]), python_version=str(entry["python_version"]),
                wheel=str(entry["wheel"]), sha256=str(entry["sha256"]),
                digest_ok=entry["digest_ok"] is True, imported=tuple(entry["imported"]),
            )  # fmt: skip
        except (KeyError, TypeError):
            return None
        if (check.interpreter != interpreter or not check.digest_ok
                or served.get(check.wheel) != check.sha256):  # fmt: skip
            return None
        checks.append(check)
    return tuple(checks)


def signed_or_reused(
    statement: dict[str, Any],
    channel: str,
    signer: Signer,
    public_key: Key,
    envelope: Path,
    reuse: ReuseStore | None,
) -> str:
    """Writes the signed envelope of `statement` at `envelope`: the stored one of the same
    content and key where `reuse` is read and holds it (its signature verified again), else a
    new signature (stored). The reuse note, or ""."""
    if reuse is None:
        sign_to(statement, signer, envelope)
        return ""
    key_inputs = statement_key_inputs(statement, public_key.keyid)
    hit = reuse.get("sign", channel, key_inputs)
    if hit is not None and isinstance(text := hit.payload.get("envelope"), str):
        atomic_write(envelope, text.encode("utf-8"))
        try:
            taken = read_and_verify_envelope(envelope, public_key)
        except SigningError:
            taken = None
        if (
            taken is not None
            and reuse_key(statement_key_inputs(taken, public_key.keyid)) == hit.key
        ):
            return hit.note()
    sign_to(statement, signer, envelope)
    stored = {"envelope": envelope.read_text(encoding="utf-8")}
    if problem := reuse.put("sign", channel, key_inputs, stored):
        console.print(f"  reuse: not stored ({problem})", markup=False)
    return ""


def index_identity(index: EmbeddedIndex | RemoteIndex) -> str:
    """The index as a verify's key names it: the embedded one by its folder (its port is another
    each time), a remote one by its URL with any credentials masked."""
    if isinstance(index, EmbeddedIndex):
        return f"embedded {index.packages_dir}"
    return masked_url(index.simple_url)


def verified_or_reused(
    index: EmbeddedIndex | RemoteIndex,
    trusted: TrustedIndex,
    stored: Path,
    statement: Statement,
    *,
    channel: str,
    project: str,
    version: str,
    interpreters: Sequence[Path],
    imports: Sequence[str],
    workdir: Path,
    limits: NetworkLimits,
    reuse: ReuseStore | None,
) -> tuple[Verification, str]:
    """Every file the index serves checked against `statement` (the one stored on the index, at
    `stored`) and TUF, then the installs: those a verify of the same files from the same index and
    TUF metadata made before, where `reuse` is read and holds them, else each made now (and
    stored). The verification and the reuse note, or ""."""

    def inputs_for(served: Mapping[str, str]) -> dict[str, Any]:
        return verify_key_inputs(
            index=index_identity(index), served=served, tuf_cache=trusted.cache_dir,
            trusted_root=TufRepository(index.tuf_dir).trusted_root_path, statement=stored,
            interpreters=interpreters, imports=imports,
        )  # fmt: skip

    if reuse is not None and reuse.reads:
        try:
            signed = statement.subjects
        except ReleaseError as exc:
            raise VerifyError(f"the signed statement cannot be read: {exc}") from None
        served = check_served_files(
            simple_url=index.simple_url, project=project, version=version, signed=signed,
            folder=workdir / "served", file_check=trusted.check_file, limits=limits,
        )  # fmt: skip
        hit = reuse.get("verify", channel, inputs_for(served))
        if hit is not None and (checks := stored_checks(hit.payload, served, interpreters)):
            return Verification(served, checks), hit.note()
    verified = verify_from_index(
        simple_url=index.simple_url, project=project, version=version, statement=statement,
        interpreters=interpreters, imports=imports, workdir=workdir,
        file_check=trusted.check_file, limits=limits,
    )  # fmt: skip
    if reuse is not None:
        key_inputs = inputs_for(verified.files)
        problem = reuse.put("verify", channel, key_inputs,
                            checks_payload(verified.checks))  # fmt: skip
        if problem:
            console.print(f"  reuse: not stored ({problem})", markup=False)
    return verified, ""
