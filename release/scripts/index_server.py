"""The embedded index's server process: pypiserver, plus the publisher's TUF repository served
read-only from the same origin.

``python -m release.scripts.index_server --tuf-metadata DIR --provenance DIR -- <pypiserver
arguments>``
serves, besides everything pypiserver serves (``/simple/``, ``/packages/``, uploads):

* ``/tuf/metadata/<file>`` from ``--tuf-metadata`` (root, targets, snapshot, timestamp);
* ``/tuf/targets/provenance/<file>`` from ``--provenance`` (the signed statements, TUF targets);
* ``/tuf/targets/provenance/<release>.attestations/<file>``: the gate attestations each names.

pypiserver serves only package files from its package directory, so the metadata gets routes of
its own on pypiserver's bottle app instead of being copied among the packages. Names starting with
a dot (an atomic write's temporary file) are never served.

An upload lands whole or not at all: pypiserver writes straight to the final name, so a full disk
left a truncated wheel that every later publish of the version refused. Here it is written to a
hidden temporary name, its size and sha256 checked against what was received, and linked into
place (never replacing a file: a lost race is a 409). A store that fails answers 507 with the
cause (no space, permission, read-only) in the body, and nothing is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

TUF_METADATA_ROUTE = "/tuf/metadata/<name>"
TUF_PROVENANCE_ROUTE = "/tuf/targets/provenance/<name>"
# A release's gate attestations, beside its statement: provenance/<release>.attestations/<name>.
TUF_ATTESTATION_ROUTE = "/tuf/targets/provenance/<folder>/<name>"
ATTESTATIONS_SUFFIX = ".attestations"


def _static_route(directory: Path) -> Callable[[str], Any]:
    from pypiserver.bottle_wrapper import HTTPError, static_file

    def serve(name: str) -> Any:
        if name.startswith(".") or "/" in name:
            return HTTPError(404, "File does not exist.")
        return static_file(name, root=str(directory), mimetype="application/json")

    return serve


def _attestation_route(directory: Path) -> Callable[[str, str], Any]:
    from pypiserver.bottle_wrapper import HTTPError

    def serve(folder: str, name: str) -> Any:
        if folder.startswith(".") or not folder.endswith(ATTESTATIONS_SUFFIX):
            return HTTPError(404, "File does not exist.")
        return _static_route(directory / folder)(name)

    return serve


def _store_whole(stream: BinaryIO, destination: str | os.PathLike[str]) -> None:
    """Replaces pypiserver's ``backend.write_file``: ``stream`` stored at ``destination`` whole,
    or an HTTP error naming why and nothing stored."""
    from pypiserver.bottle_wrapper import HTTPError

    target = Path(destination)
    offset = stream.tell()
    temporary: str | None = None
    try:
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        received, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                out.write(chunk)
                received.update(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        stored = hashlib.sha256()
        with open(temporary, "rb") as written:
            for chunk in iter(lambda: written.read(1 << 20), b""):
                stored.update(chunk)
        if os.path.getsize(temporary) != size or stored.hexdigest() != received.hexdigest():
            raise HTTPError(507, f"cannot store {target.name}: the stored bytes differ from the "
                                 "received ones; nothing was kept")  # fmt: skip
        os.chmod(temporary, 0o644)
        os.link(temporary, target)
    except FileExistsError:
        raise HTTPError(409, f"{target.name} already exists (another upload stored it first); "
                             "nothing was replaced") from None  # fmt: skip
    except OSError as exc:
        cause = f"{exc.strerror} ({errno.errorcode.get(exc.errno or 0, exc.errno)})"
        raise HTTPError(507, f"cannot store {target.name} in the index's package folder: "
                             f"{cause}; nothing was kept") from None  # fmt: skip
    finally:
        stream.seek(offset)
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def main(argv: Sequence[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if "--" not in arguments:
        raise SystemExit("usage: python -m release.scripts.index_server --tuf-metadata DIR "
                         "--provenance DIR -- <pypiserver arguments>")  # fmt: skip
    split = arguments.index("--")
    parser = argparse.ArgumentParser(prog="python -m release.scripts.index_server")
    parser.add_argument("--tuf-metadata", type=Path, required=True)
    parser.add_argument("--provenance", type=Path, required=True)
    ours = parser.parse_args(arguments[:split])

    import pypiserver
    import pypiserver.backend
    from pypiserver.__main__ import main as pypiserver_main

    # The backends call the module's write_file at upload time (pypiserver 2.4.2, backend.py:150).
    pypiserver.backend.write_file = _store_whole

    add_pypiserver_routes = pypiserver.setup_routes_from_config

    def add_routes(app: Any, config: Any) -> Any:
        app = add_pypiserver_routes(app, config)
        app.route(TUF_METADATA_ROUTE, "GET", _static_route(ours.tuf_metadata.resolve()))
        app.route(TUF_PROVENANCE_ROUTE, "GET", _static_route(ours.provenance.resolve()))
        app.route(TUF_ATTESTATION_ROUTE, "GET", _attestation_route(ours.provenance.resolve()))
        return app

    # pypiserver's main looks the hook up on its package at run time; it builds the app with it.
    pypiserver.setup_routes_from_config = add_routes
    pypiserver_main(arguments[split + 1 :])


if __name__ == "__main__":
    main()
