"""The actions a generated workflow uses, each pinned by the commit of its version tag, and the
builders of its steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import LiteralScalarString


@dataclass(frozen=True)
class ActionPin:
    """An action pinned by the commit of its version tag."""

    repo: str
    tag: str
    sha: str

    @property
    def ref(self) -> str:
        return f"{self.repo}@{self.sha}"


# Commits read from each action's own repository (tag -> commit).
CHECKOUT = ActionPin("actions/checkout", "v7.0.1", "3d3c42e5aac5ba805825da76410c181273ba90b1")
SETUP_PYTHON = ActionPin(
    "actions/setup-python", "v7.0.0", "5fda3b95a4ea91299a34e894583c3862153e4b97"
)
UPLOAD = ActionPin("actions/upload-artifact", "v7.0.0", "bbbca2ddaa5d8feaa63e36b76fdaad77386f024f")
DOWNLOAD = ActionPin(
    "actions/download-artifact", "v8.0.1", "3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c"
)


def uses(
    pin: ActionPin,
    title: str | None = None,
    *,
    condition: str | None = None,
    continue_on_error: bool = False,
    env: dict[str, str] | None = None,
    **inputs: Any,
) -> CommentedMap:
    """A step that runs an action; `inputs` become its `with:` (`_` written as `-`)."""
    step = CommentedMap()
    if title:
        step["name"] = title
    if condition:
        step["if"] = condition
    if continue_on_error:
        step["continue-on-error"] = True
    step["uses"] = pin.ref
    step.yaml_add_eol_comment(pin.tag, "uses")
    if inputs:
        step["with"] = {key.replace("_", "-"): value for key, value in inputs.items()}
    if env:
        step["env"] = env
    return step


def run(
    name: str,
    command: str,
    condition: str | None = None,
    tolerate: bool = False,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A shell step; a script of several lines is written as a YAML block."""
    text = command.strip()
    step: dict[str, Any] = {"name": name}
    if condition:
        step["if"] = condition
    if tolerate:
        step["continue-on-error"] = True
    step["run"] = LiteralScalarString(text + "\n") if "\n" in text else text
    if env:
        step["env"] = env
    return step


def checkout(history: bool) -> CommentedMap:
    # Full history where SOURCE_DATE_EPOCH or the source commit is read from git.
    settings: dict[str, Any] = {"persist_credentials": False}
    if history:
        settings["fetch_depth"] = 0
    return uses(CHECKOUT, **settings)


def block(lines: list[str]) -> LiteralScalarString:
    """Lines as one YAML block (an action input of several values)."""
    return LiteralScalarString("\n".join(lines))
