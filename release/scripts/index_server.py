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
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
    from pypiserver.__main__ import main as pypiserver_main

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
