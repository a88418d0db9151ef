"""JSON records read back from disk: every way a file can fail to be one is a ValueError whose
message says what was expected, for the caller to prefix with the file and raise as its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JsonFileError(ValueError):
    """The file is there but holds no JSON value (the message has no path: callers add it)."""


def refuse_constant(name: str) -> Any:
    """A `parse_constant` for json.loads: Python reads NaN, Infinity and -Infinity, which JSON
    does not have (other readers reject them)."""
    raise JsonFileError(f"expected JSON numbers; got {name}, which JSON does not allow")


def read_json(path: Path) -> Any:
    """The JSON value in `path`. FileNotFoundError passes through (callers decide what an absent
    record means); a folder, an unreadable file, bytes that are not UTF-8, text that is not JSON
    (NaN and Infinity included) or JSON nested deeper than the parser goes is a JsonFileError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as error:
        raise JsonFileError(f"expected a readable file; got {error.strerror or error}") from None
    return parse_json(data)


def parse_json(data: bytes) -> Any:
    """The JSON value of ``data``, UTF-8 without a byte-order mark (RFC 8259 §8.1: senders
    never add one); JsonFileError saying what else it is."""
    if data.startswith(b"\xef\xbb\xbf"):
        raise JsonFileError("expected JSON text; got a UTF-8 byte-order mark before it")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=refuse_constant)
    except UnicodeDecodeError as error:
        said = f"expected UTF-8 text; got {error.reason} at byte {error.start}"
        raise JsonFileError(said) from None
    except json.JSONDecodeError as error:
        raise JsonFileError(f"expected JSON; {error}") from None
    except RecursionError:
        said = "expected JSON; got values nested deeper than the parser goes"
        raise JsonFileError(said) from None
