"""The building blocks of the pipeline's typed settings (the manifest, each gate's settings):
a frozen model that refuses unknown keys, and field checks that raise with the phrase that
follows "expected" in the error line the manifest's loader writes."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt
from pydantic_core import PydanticCustomError


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def require(ok: bool, expected: str) -> None:
    if not ok:
        raise PydanticCustomError("manifest", expected)


def pattern(regex: str, expected: str, flags: int = 0) -> Callable[[str], str]:
    compiled = re.compile(regex, flags)

    def matches(value: str) -> str:
        require(compiled.fullmatch(value) is not None, expected)
        return value

    return matches


def non_empty(value: tuple[Any, ...]) -> tuple[Any, ...]:
    require(len(value) > 0, "a non-empty array")
    return value


def unique(what: str) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    def distinct(value: tuple[Any, ...]) -> tuple[Any, ...]:
        require(len(set(value)) == len(value), f"{what} without duplicates")
        return value

    return distinct


def bounded(high: int) -> Any:
    """A positive integer no larger than `high` (what the engine and a gate's run can hold)."""
    return Annotated[StrictInt, Field(gt=0, le=high)]
