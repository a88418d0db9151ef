"""Follow `python -m release ARGS` through the pipeline's own modules and count how often the
flow comes back to a module it had already left (issue 35 item 3's measure).

    python tests/tools/module_returns.py [--from MODULE:FUNCTION] [--json FILE] -- run ...

Every call into and return to a function of `release/` (this process's main thread; child
interpreters are not followed) moves the flow to that function's module; consecutive events in
one module are one step. Printed: the number of steps, the entries into release/trust/sign.py
and the statement module, and the returns (steps into a module the flow had left before), in
all and per module. `--from` starts counting at the first call of that function, e.g.
`release.trust.steps:sign_publish_verify` for the trust half of `run`. Set CI=1 to keep a run
from reusing what an earlier one stored (release/util/reuse.py), so the whole flow is followed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import runpy
import sys
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "release"
WATCHED = ("release.trust.sign", "release.statement")


class Follower:
    """The collapsed sequence of `release` modules the flow passes through."""

    def __init__(self, start: str | None) -> None:
        self.start = start  # "module:function" to begin at, or None: from the first call
        self.steps: list[str] = []
        self._names: dict[str, str | None] = {}  # file name -> module (None: not the pipeline)

    def module_of(self, frame: FrameType) -> str | None:
        filename = frame.f_code.co_filename
        name = self._names.get(filename, "")
        if name == "":
            path = Path(filename)
            name = None
            if path.is_absolute() and path.is_relative_to(PACKAGE) and path.suffix == ".py":
                parts = path.relative_to(REPO).with_suffix("").parts
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            self._names[filename] = name
        return name

    def _innermost(self, frame: FrameType | None) -> str | None:
        while frame is not None:
            module = self.module_of(frame)
            if module is not None:
                return module
            frame = frame.f_back
        return None

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = self.module_of(frame)
            if module is None:
                return
            if self.start is not None:
                if f"{module}:{frame.f_code.co_name}" != self.start:
                    return
                self.start = None
        elif event == "return":
            if self.start is not None or self.module_of(frame) is None:
                return
            module = self._innermost(frame.f_back)
            if module is None:
                return
        else:
            return
        if not self.steps or self.steps[-1] != module:
            self.steps.append(module)


def summary(steps: list[str]) -> dict[str, Any]:
    """Steps, entries into the watched modules, and returns (in all and per module)."""
    left: set[str] = set()
    returns: Counter[str] = Counter()
    for previous, module in itertools.pairwise(steps):
        left.add(previous)
        if module in left:
            returns[module] += 1
    return {
        "steps": len(steps),
        "modules": len(set(steps)),
        "entries": {name: steps.count(name) for name in WATCHED},
        "returns": sum(returns.values()),
        "returns_by_module": dict(returns.most_common()),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="start", metavar="MODULE:FUNCTION")
    parser.add_argument("--json", type=Path, help="write the summary and the steps here")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then release's arguments")
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    follower = Follower(options.start)
    sys.argv = ["release", *args]
    sys.path.insert(0, str(REPO))
    code: int | str | None = 0
    sys.setprofile(follower.profile)
    try:
        runpy.run_module("release", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    result = summary(follower.steps)
    if options.json is not None:
        options.json.write_text(json.dumps({**result, "sequence": follower.steps}, indent=1))
    top = ", ".join(f"{m} {n}" for m, n in list(result["returns_by_module"].items())[:12])
    print(f"\nmodule_returns: exit {code}; {result['steps']} steps through "
          f"{result['modules']} modules; entries: "
          + ", ".join(f"{m} {n}" for m, n in result["entries"].items())
          + f"; returns {result['returns']} ({top})", file=sys.stderr)  # fmt: skip
    return code if isinstance(code, int) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
