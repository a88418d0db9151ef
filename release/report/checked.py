"""Measurement records read through checks: each missing or ill-shaped value raises ShapeError
naming its key (`rows[2].h2d_gbps`). Such records are shown as they are, so this is their one
reader: the report's sections and the typed GPU staging record (release/report/staging_record.py,
which the report and the README's staging evidence read) both go through it."""

from __future__ import annotations

import json
import math
from typing import Any


class ShapeError(ValueError):
    """A value of a record that is missing or not of the agreed shape, named by its key."""


def shown_type(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value)


class Checked:
    """One object of a measurement record, read through checks that raise ShapeError naming
    the key (`rows[2].h2d_gbps`): such records are shown as they are, so nothing else checks."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise ShapeError(
                f"{where or '<top level>'}: expected an object; got {shown_type(data)}"
            )
        self.data: dict[str, Any] = data
        self.where = f"{where}." if where else ""

    def get(self, key: str) -> Any:
        if key not in self.data:
            raise ShapeError(f"{self.where}{key}: missing")
        return self.data[key]

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise ShapeError(f"{self.where}{key}: expected text; got {shown_type(value)}")
        return value

    def number(self, key: str) -> float:
        value = self.get(key)
        # bool is an int to Python, and JSON's 1e400 reads as infinity.
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise ShapeError(f"{self.where}{key}: expected a number; got {shown_type(value)}")
        return value

    def whole(self, key: str, least: int) -> int:
        """A count or a size: a whole number of at least `least` (16384.0 is 16384)."""
        value = self.number(key)
        if value < least or value != int(value):
            raise ShapeError(f"{self.where}{key}: expected a whole number >= {least}; got {value}")
        return int(value)

    def entry(self, key: str) -> Checked:
        return Checked(self.get(key), f"{self.where}{key}")

    def listed(self, key: str) -> list[Checked]:
        """The objects listed under `key`, which must be there."""
        self.get(key)
        return self.entries(key)

    def entries(self, key: str) -> list[Checked]:
        """The objects listed under `key`; none where it is absent or null."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ShapeError(
                f"{self.where}{key}: expected a list of objects; got {shown_type(value)}"
            )
        return [Checked(item, f"{self.where}{key}[{i}]") for i, item in enumerate(value)]


# What a record of an unexpected shape can raise past the checks (matplotlib on odd figures
# included): the module promises such a record is reported, never raised.
SHAPE_ERRORS = (LookupError, TypeError, ValueError, AttributeError, ArithmeticError)
