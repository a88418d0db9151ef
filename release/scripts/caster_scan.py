"""Lists the nanobind signature of every function and method of native modules, as JSON.

Run by the casters gate (release/gates/casters.py) with the interpreter a wheel serves, as a script:
``python -I caster_scan.py SITE MODULE...``. It imports each module from SITE (the installed
wheel) and prints ``[{"name": qualified name, "signatures": [...]}, ...]``. Standard library only.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def _signatures(obj: object) -> list[str] | None:
    overloads = getattr(obj, "__nb_signature__", None)
    if not isinstance(overloads, tuple):
        return None
    return [str(overload[0]) for overload in overloads]


def scan(module: Any) -> list[dict[str, Any]]:
    """Each bound callable of ``module``: functions, methods, properties, nested classes."""
    found: list[dict[str, Any]] = []
    seen: set[int] = set()

    def visit(name: str, obj: object) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, property):
            for accessor in (obj.fget, obj.fset):
                if accessor is not None:
                    visit(name, accessor)
            return
        signatures = _signatures(obj)
        if signatures is not None:
            found.append({"name": name, "signatures": signatures})
        if isinstance(obj, type) and obj.__module__ == module.__name__:
            for attribute, member in vars(obj).items():
                visit(f"{name}.{attribute}", member)

    for attribute, obj in vars(module).items():
        visit(f"{module.__name__}.{attribute}", obj)
    return found


def main(argv: list[str]) -> int:
    site, *modules = argv
    sys.path.insert(0, site)
    result = [entry for name in modules for entry in scan(importlib.import_module(name))]
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
