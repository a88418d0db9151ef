"""docs/manifest.md is generated from the models (release/manifest/reference.py): the committed
page is what they render, every gate's table is on it from its own model, and a key added to a
model shows up there (so the page cannot drift)."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import Field, StrictInt

from release import catalogue
from release.manifest import reference


def test_the_committed_page_is_what_the_models_render() -> None:
    assert reference.PAGE.read_text(encoding="utf-8") == reference.render(), (
        "docs/manifest.md drifted from the models: run python -m release.manifest.reference --write"
    )


def test_each_gate_is_listed_with_its_own_table() -> None:
    page = reference.render()
    for name, entry in catalogue.GATES.items():
        model = entry.settings.__name__
        assert f"| `{name}` | `{entry.runner}` | [{model}](#{model.lower()}) |" in page
    assert "`[gates.warmup]`: " in page and "| `steady_steps` | integer (> 0, <= 1000000) |" in page
    assert "`[[gates.parity.cells]]`: " in page


def test_a_key_added_to_a_gate_model_shows_on_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    class Planted(catalogue.WarmupSettings):
        """`[gates.warmup]` with one more key."""

        seconds: Annotated[StrictInt, Field(gt=0, le=60)] = 5

    planted = catalogue.Entry("release.gates.warmup", "gpu", Planted)
    monkeypatch.setitem(catalogue.GATES, "warmup", planted)
    page = reference.render()
    assert page != reference.PAGE.read_text(encoding="utf-8")
    assert "| `seconds` | integer (> 0, <= 60) | `5` |" in page


@pytest.mark.parametrize(
    ("annotation", "text"),
    [
        (tuple[str, ...], "array of string"),
        (dict[str, catalogue.ParityCell], "table of table ([ParityCell](#paritycell))"),
        (str | None, "string"),
    ],
)
def test_types_are_named_as_toml_calls_them(annotation: object, text: str) -> None:
    assert reference.type_text(annotation) == text
