"""The manifest's error lines: one per problem, ``<file>: <dotted.key>: expected <what>;
got <value>``, with keys and values shown so a terminal shows them safely and URLs masked."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from release.util.urls import mask_urls

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Issue:
    loc: Loc
    expected: str
    got: str


_EXPECTED_BY_TYPE = {
    "string_type": "a string",
    "int_type": "an integer",
    "greater_than": "an integer greater than 0",
    "greater_than_equal": "an integer of 0 or more",
    "tuple_type": "an array",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def from_pydantic(error: Any, root: type[BaseModel]) -> Issue:
    """One pydantic error of validating `root` as an Issue that says what was expected."""
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    got = shown(error["input"])
    if kind == "manifest":
        expected = error["msg"]
    elif kind == "missing":
        expected, got = "this key (it is required)", "nothing"
    elif kind == "extra_forbidden":
        # A table validated by a model of its own (a gate's) carries the keys that model allows.
        keys = (error.get("ctx") or {}).get("keys") or known_keys(root, loc[:-1])
        expected = "one of the keys " + ", ".join(keys) if keys else "no such key"
        got = "an unknown key"
    elif kind in ("less_than_equal", "less_than"):
        bound = error["ctx"].get("le", error["ctx"].get("lt"))
        expected = f"an integer {'at most' if kind == 'less_than_equal' else 'below'} {bound}"
    elif kind == "literal_error":
        choices = error["ctx"]["expected"].replace("'", '"')
        expected = f"one of {choices}" if " or " in choices else choices
    else:
        expected = _EXPECTED_BY_TYPE.get(kind, f"a valid value ({error['msg']})")
    if loc and loc[-1] == "[key]":
        loc, expected = loc[:-1], f"{expected} (as a table name)"
    return Issue(loc, expected, got)


def known_keys(root: type[BaseModel], loc: Loc) -> list[str]:
    """The keys the schema of `root` allows in the table at ``loc`` (empty if it cannot tell)."""
    node: Any = root
    for part in loc:
        node = _unwrapped(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return []
            node = field.annotation
        elif get_origin(node) in (dict, tuple):
            node = get_args(node)[-1 if get_origin(node) is dict else 0]
        else:
            return []
    node = _unwrapped(node)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return list(node.model_fields)
    return []


def _unwrapped(node: Any) -> Any:
    """The type under Annotated[...] and Optional[...] (an optional table lists X's keys)."""
    while True:
        if get_origin(node) is Annotated:
            node = get_args(node)[0]
        elif get_origin(node) in (Union, UnionType):
            node = next(a for a in get_args(node) if a is not type(None))
        else:
            return node


def syntax_error(path: Path, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match is None:
        return f"{path}: expected valid TOML; got {message}"
    where = f"line {match.group(1)}, column {match.group(2)}"
    return f"{path}: {where}: expected valid TOML; got {message[: match.start()]}"


def error_line(path: Path, loc: Loc, expected: str, got: str) -> str:
    return f"{path}: {dotted(loc)}: expected {expected}; got {got}"


def dotted(loc: Loc) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else f".{_key(part)}" if key else _key(part)
    return key or "<top level>"


def _key(part: object) -> str:
    """A key as an error shows it: quoted and escaped if it holds what a terminal would act on
    or hide (control or non-printing characters), shortened if long."""
    text = str(part)
    if not text.isprintable() or " " in text:
        text = json.dumps(text)
    return text if len(text) <= 60 else text[:57] + "..."


def shown(value: object, limit: int = 80) -> str:
    """A value as TOML-like text, shortened, with a URL's userinfo and query masked."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    # What a terminal would act on or hide (bidi overrides, zero-width): escaped as JSON would.
    text = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)
    text = mask_urls(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def choices(items: Sequence[str], conjunction: str) -> str:
    quoted = [f'"{item}"' for item in items]
    if len(quoted) <= 1:
        return "".join(quoted) or "(none declared)"
    return f"{', '.join(quoted[:-1])} {conjunction} {quoted[-1]}"
