"""The consumer's steps of the command line: ``verify --index URL NAME==VERSION``
(release/trust/verify.py) and ``rebuild`` (release/trust/rebuild.py), each a check of a published
release from its index alone, with none of the manifest's channels, keys or index (only its
network limits); and what every verify imports from the wheels it installs and how it lists the
files served, which the publisher's verify (release/trust/steps.py) shares.

May import: everything of ``release.trust``, ``release.context``, ``release.errors`` and
``release.util``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from release.context import Context
from release.errors import VerifyError
from release.trust.rebuild import rebuild_release
from release.trust.tuf_client import refuse_credentials
from release.trust.verify import verify_release
from release.util.atomic import atomic_write
from release.util.progress import console
from release.util.urls import masked_url

# What every verify imports from each wheel it installs (the consumer's: unless --import is given).
MODULES = ("activekv._engine", "activekv._fabric")


def print_served(files: dict[str, str]) -> None:
    """The files the index serves for the version, each with the digest the statement signs."""
    console.print(f"  every file the index serves for this version ({len(files)}) is one the "
                  "signed statement names, with its digest:", soft_wrap=True)  # fmt: skip
    for name, digest in sorted(files.items()):
        console.print(f"    {name} sha256 {digest}", markup=False, soft_wrap=True)


def step_verify_index(context: Context, args: Any) -> int:
    """`verify --index URL NAME==VERSION`: the consumer's check (release/trust/verify.py)."""

    given = {"NAME==VERSION": args.requirement, "--root": args.root,
             "--provenance-key": args.provenance_key}  # fmt: skip
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        raise VerifyError(
            f"verify --index {masked_url(args.index)}: also give {', '.join(missing)}"
        )
    if args.channel is not None:
        raise VerifyError("verify --index: --channel is for the publisher's own index; drop it")
    interpreters = [p.resolve() for p in args.python] or [Path(sys.executable)]
    with console.status(f"verifying {args.requirement} from {masked_url(args.index)}"):
        verified = verify_release(
            index_url=args.index, requirement=args.requirement, trusted_root=args.root,
            provenance_key=args.provenance_key, interpreters=interpreters,
            imports=args.imports or MODULES, workdir=context.out_dir / "verify-index",
            tuf_url=args.tuf_url, cache_dir=args.tuf_cache, limits=context.manifest.publish.limits,
        )  # fmt: skip
    print_served(verified.files)
    for check in verified.checks:
        console.print(f"  python {check.python_version}: {check.wheel} matches its TUF target "
                      f"and the signed statement; imported {', '.join(check.imported)}",
                      soft_wrap=True)  # fmt: skip
    return 0


def _clear_rebuild_record(out_dir: Path) -> Path:
    """<out>/rebuild.json, removed before the rebuild starts: a run that fails leaves no record
    of an earlier one behind to be read as this one's verdict."""
    record = out_dir / "rebuild.json"
    if out_dir.exists() and not out_dir.is_dir():
        raise VerifyError(
            f"--out {out_dir}: expected a folder for rebuild.json and the work folder; it is a file"
        )
    if record.is_dir() and not record.is_symlink():
        raise VerifyError(
            f"--out: {record}: expected the rebuild's record (a file) or nothing; it is a folder"
        )
    try:
        record.unlink(missing_ok=True)
    except OSError as error:
        raise VerifyError(
            f"--out: {record}: cannot remove the earlier record ({error.strerror or error})"
        ) from None
    return record


def step_rebuild(context: Context, args: Any) -> int:
    """`rebuild --index URL NAME==VERSION --source PATH_OR_URL`: the consumer's rebuild check
    (release/trust/rebuild.py); writes <out>/rebuild.json and fails naming the first difference."""
    given = {"--index": args.index, "NAME==VERSION": args.requirement, "--root": args.root,
             "--provenance-key": args.provenance_key, "--source": args.source}  # fmt: skip
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        raise VerifyError(f"rebuild: also give {', '.join(missing)}")
    refuse_credentials("--index", args.index)  # never echoed: rebuild's messages name the URLs
    if args.tuf_url is not None:
        refuse_credentials("--tuf-url", args.tuf_url)
    record = _clear_rebuild_record(context.out_dir)
    with console.status(f"rebuilding {args.requirement} (python {args.python}) from {args.source}"):
        result = rebuild_release(
            index_url=args.index, requirement=args.requirement, trusted_root=args.root,
            provenance_key=args.provenance_key, source=args.source, python=args.python,
            workdir=context.out_dir / "rebuild", build_cache=context.cache_dir,
            tuf_url=args.tuf_url, tuf_cache=args.tuf_cache, limits=context.manifest.publish.limits,
        )  # fmt: skip
    atomic_write(record, (json.dumps(dataclasses.asdict(result), indent=2) + "\n").encode())
    for line in result.toolchain_differences:
        console.print(f"  toolchain differs from the record: {escape(line)}", soft_wrap=True)
    if not result.identical:
        other_tools = " (the rebuild ran on other tools, listed above)"
        raise VerifyError(
            f"the rebuild of {result.wheel} at commit {result.commit} is not the published wheel "
            f"(sha256 {result.published_sha256}; rebuilt {result.rebuilt_sha256}): "
            + "; ".join(result.differences)
            + (other_tools if result.toolchain_differences else "")
        )
    console.print(
        f"{result.wheel}: bit-identical to its rebuild at commit {result.commit} "
        f"(sha256 {result.rebuilt_sha256}); record: {record}",
        soft_wrap=True,
    )
    return 0
