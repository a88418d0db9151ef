"""Follow `python -m release ARGS` through the pipeline's own modules and count how often the
flow comes back to a module it had already left (issue 35 item 3's measure).

    python tests/tools/module_returns.py [--grain site|call] [--from MODULE:FUNCTION]
                                         [--json FILE] -- run ...

Only this process's main thread is followed (child interpreters and worker threads are not).
A step moves the flow into a module of `release/`; the flow leaves a module when a step starts
from it, and a return is a step into a module it had left before. Printed: the steps, the
entries (steps) into release/trust/sign.py and release/statement.py, the returns in all and
per module; `--json` also writes each step (from module, to module, caller -> callee, file:line).

`--grain site` (the default) follows the code as a reader does by hand, each call site once.
The reader follows a call when the caller's code spells it out: a call made by release code,
or the resumption of a generator it made (a `with` on a context manager, a loop), of a
function that is neither a property nor a dunder other than __init__, __new__, __call__,
__enter__ and __exit__. Calls made by library code (validators, hooks, module bodies run on
import) are not followed. A call site is the caller's code object and line with the callee's
code object; only its first run is followed, its later runs are skipped with all beneath them,
as are the calls the reader does not follow. A step is a followed call from one module into
another; returning to the caller is not a step (the reader resumes where they were).

`--grain call` counts every call into and return to a function of `release/`: each moves the
flow to that function's module, consecutive events in one module are one step.

`--from` starts counting at the first call of that function, e.g.
`release.trust.steps:sign_publish_verify` for the trust half of `run`. Set CI=1 to keep a run
from reusing what an earlier one stored (release/util/reuse.py), so the whole flow is followed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import runpy
import sys
import threading
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "release"
WATCHED = ("release.trust.sign", "release.statement")
SPELLED_DUNDERS = frozenset({"__init__", "__new__", "__call__", "__enter__", "__exit__"})
GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
ACCESSORS = ("fget", "fset", "fdel", "func")  # property, functools.cached_property


class Step(NamedTuple):
    module: str  # where the flow goes
    source: str | None  # where it comes from (None: the first step, or --from's)
    via: str  # caller -> callee (file:line of the call or of the line returned to)


class Follower:
    """The steps of the flow through `release` modules, at one grain."""

    def __init__(self, start: str | None, grain: str) -> None:
        self.start = start  # "module:function" to begin at, or None: from the first call
        self.grain = grain
        self.steps: list[Step] = []
        self._names: dict[str, str | None] = {}  # file name -> module (None: not the pipeline)
        self._sites: set[tuple[CodeType, int, CodeType]] = set()
        self._spelled: dict[CodeType, bool] = {}
        self._skipping: FrameType | None = None  # a frame not followed, until it returns

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

    def _innermost(self, frame: FrameType | None) -> FrameType | None:
        while frame is not None and self.module_of(frame) is None:
            frame = frame.f_back
        return frame

    def _via(self, caller: FrameType, callee: FrameType, returning: bool = False) -> str:
        names = [getattr(f.f_code, "co_qualname", f.f_code.co_name) for f in (caller, callee)]
        path = Path(caller.f_code.co_filename).relative_to(REPO)
        arrow = f"{names[1]} returns to {names[0]}" if returning else " -> ".join(names)
        return f"{arrow} ({path}:{caller.f_lineno})"

    def _is_spelled(self, frame: FrameType, caller: FrameType) -> bool:
        """Whether the caller's code spells out this call (--grain site)."""
        code = frame.f_code
        if frame.f_back is not caller and not code.co_flags & GENERATOR:
            return False  # called by library code
        if code not in self._spelled:
            name = code.co_name
            owner = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
            found = inspect.getattr_static(type(owner), name, None)
            accessors = (getattr(found, accessor, None) for accessor in ACCESSORS)
            codes = {getattr(accessor, "__code__", None) for accessor in accessors}
            dunder = name.startswith("__") and name.endswith("__")
            self._spelled[code] = name in SPELLED_DUNDERS if dunder else code not in codes
        return self._spelled[code]

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if self._skipping is not None:
            if event == "return" and frame is self._skipping:
                self._skipping = None
            return
        if event not in ("call", "return") or (module := self.module_of(frame)) is None:
            return
        caller = self._innermost(frame.f_back)
        if self.start is not None:
            if event == "return" or f"{module}:{frame.f_code.co_name}" != self.start:
                return
            self.start = None
            via = "" if caller is None else self._via(caller, frame)
            self.steps.append(Step(module, None, via))
        elif self.grain == "call":
            self._call_grain(frame, event, module, caller)
        elif event == "call" and caller is None:
            self.steps.append(Step(module, None, ""))
        elif event == "call" and caller is not None:
            site = (caller.f_code, caller.f_lineno, frame.f_code)
            if site in self._sites or not self._is_spelled(frame, caller):
                self._skipping = frame
                return
            self._sites.add(site)
            if (source := self.module_of(caller)) != module:
                self.steps.append(Step(module, source, self._via(caller, frame)))

    def _call_grain(
        self, frame: FrameType, event: str, module: str, caller: FrameType | None
    ) -> None:
        source = self.steps[-1].module if self.steps else None
        if event == "return":
            if caller is None:
                return
            module, via = self.module_of(caller) or "", self._via(caller, frame, returning=True)
        else:
            via = "" if caller is None else self._via(caller, frame)
        if source != module:
            self.steps.append(Step(module, source, via))


def summary(steps: list[Step]) -> dict[str, Any]:
    """Steps, entries (steps into the watched modules) and returns: in all, per module, per
    pair of modules, per step."""
    left: set[str] = set()
    returns: list[Step] = []
    for step in steps:
        if step.source is not None:
            left.add(step.source)
        if step.module in left:
            returns.append(step)
    by_pair = Counter(f"{step.source} -> {step.module}" for step in returns)
    by_step = Counter(f"{step.source} -> {step.module}: {step.via}" for step in returns)
    return {
        "steps": len(steps),
        "modules": len({step.module for step in steps}),
        "entries": {name: sum(step.module == name for step in steps) for name in WATCHED},
        "returns": len(returns),
        "returns_by_module": dict(Counter(step.module for step in returns).most_common()),
        "returns_by_pair": dict(by_pair.most_common()),
        "returns_by_step": dict(by_step.most_common()),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grain", choices=("site", "call"), default="site")
    parser.add_argument("--from", dest="start", metavar="MODULE:FUNCTION")
    parser.add_argument("--json", type=Path, help="write the summary and the steps here")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then release's arguments")
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    follower = Follower(options.start, options.grain)
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
        threading.setprofile(None)
    result = {"grain": options.grain, **summary(follower.steps)}
    if options.json is not None:
        sequence = [step._asdict() for step in follower.steps]
        options.json.write_text(json.dumps({**result, "sequence": sequence}, indent=1))
    top = ", ".join(f"{m} {n}" for m, n in list(result["returns_by_module"].items())[:12])
    print(f"\nmodule_returns ({options.grain}): exit {code}; {result['steps']} steps through "
          f"{result['modules']} modules; entries: "
          + ", ".join(f"{m} {n}" for m, n in result["entries"].items())
          + f"; returns {result['returns']} ({top})", file=sys.stderr)  # fmt: skip
    return code if isinstance(code, int) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
