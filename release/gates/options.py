"""What a gate's own command line may add, each option declared once: the field of
``GateOptions`` a gate reads, and the flag, help and commands the parser (release/cli_options.py)
gives it. The whole release runs with the defaults."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def count(high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to ``high`` (argparse names the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from 1 to {high}; got {text!r}"
            )
        return value

    return parse


@dataclass(frozen=True)
class Flag:
    """How one option reads on the command line of the `commands` that take it."""

    flag: str
    help: str
    commands: tuple[str, ...]
    repeatable: bool = False  # given once per value, as a list
    type: Callable[[str], Any] | None = None
    metavar: str | None = None


def _flag(flag: Flag) -> dict[str, Flag]:
    return {"flag": flag}


@dataclass(frozen=True)
class GateOptions:
    """What a gate's own command line may add; the whole release runs with the defaults."""

    cells: tuple[str, ...] = field(
        default=(),
        metadata=_flag(
            Flag("--cell", "run only this cell (repeatable)", ("parity",), True, metavar="NAME")
        ),
    )
    interpreters: tuple[Path, ...] = field(
        default=(),
        metadata=_flag(
            Flag(
                "--python",
                "an interpreter to judge the wheels of its version with (repeatable; default: this "
                "one, or one found on PATH or under pyenv)",
                ("parity", "gpu-gates"),
                True,
                Path,
                "PATH",
            )
        ),
    )
    vllm_pythons: tuple[Path, ...] = field(
        default=(),
        metadata=_flag(
            Flag(
                "--vllm-python",
                "a Python 3.11+ that has one of the vLLM releases the shim pins (repeatable; "
                "besides $ACTIVEKV_VLLM_PYTHON and this one)",
                ("served-path",),
                True,
                Path,
                "PATH",
            )
        ),
    )
    layers: int = field(
        default=4,
        metadata=_flag(Flag("--layers", "model layers", ("served-path",), type=count(512))),
    )
    steps: int = field(
        default=6,
        metadata=_flag(Flag("--steps", "scheduler steps", ("served-path",), type=count(100_000))),
    )
    python: tuple[str, ...] = field(
        default=(),
        metadata=_flag(
            Flag(
                "--python",
                "only this declared version (repeatable)",
                ("reproduce",),
                True,
                metavar="X.Y",
            )
        ),
    )


def flags(command: str) -> list[tuple[str, Flag, Any]]:
    """(field, flag, default) of each option `command` takes, in declaration order."""
    return [
        (f.name, f.metadata["flag"], f.default)
        for f in dataclasses.fields(GateOptions)
        if command in f.metadata["flag"].commands
    ]


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """`command`'s options, as declared above, each filling the field of its name."""
    for name, flag, default in flags(command):
        said = (
            flag.help if flag.repeatable or default is None else f"{flag.help} (default {default})"
        )
        parser.add_argument(
            flag.flag,
            dest=name,
            action="append" if flag.repeatable else "store",
            default=[] if flag.repeatable else default,
            type=flag.type,
            metavar=flag.metavar,
            help=said,
        )


def given(arguments: dict[str, Any]) -> GateOptions:
    """The options a parsed command line holds (its other arguments are not options)."""
    names = {f.name for f in dataclasses.fields(GateOptions)}
    return GateOptions(**{
        name: tuple(value) if isinstance(value, list) else value
        for name, value in arguments.items()
        if name in names
    })  # fmt: skip
