"""docs/manifest.md, the manifest's reference, generated from the models (as scikit-build-core
generates its settings docs): every table with its keys, their types, bounds and defaults, each
gate's table from the model its catalogue entry declares. tests/test_manifest_reference.py fails
when the committed page drifts from the models.

    python -m release.manifest.reference            # print the page
    python -m release.manifest.reference --write    # write docs/manifest.md
"""

from __future__ import annotations

import argparse
import inspect
import sys
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from release import catalogue
from release.manifest.models import Manifest
from release.util.atomic import atomic_write
from release.util.paths import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "manifest.md"
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _model(annotation: Any) -> type[BaseModel] | None:
    return annotation if inspect.isclass(annotation) and issubclass(annotation, BaseModel) else None


def _parts(annotation: Any) -> tuple[Any, list[Any]]:
    """The type under Annotated[...], with the metadata found on the way."""
    metadata: list[Any] = []
    while get_origin(annotation) is Annotated:
        annotation, *more = get_args(annotation)
        metadata += more
    return annotation, metadata


def _bounds(metadata: list[Any]) -> str:
    said = []
    for item in metadata:
        for constraint in getattr(item, "metadata", [item]):
            if isinstance(constraint, Gt):
                said.append(f"> {constraint.gt}")
            elif isinstance(constraint, Ge):
                said.append(f">= {constraint.ge}")
            elif isinstance(constraint, Lt):
                said.append(f"< {constraint.lt}")
            elif isinstance(constraint, Le):
                said.append(f"<= {constraint.le}")
    return f" ({', '.join(said)})" if said else ""


def type_text(annotation: Any, given: list[Any] | None = None) -> str:
    """How the page names a key's type: "integer (> 0, <= 512)", "array of string", "table";
    `given`: the constraints pydantic keeps beside the annotation (a field's metadata)."""
    annotation, metadata = _parts(annotation)
    metadata += given or []
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        return " or ".join(type_text(a) for a in options)
    if origin is Literal:
        return "one of " + ", ".join(f'`"{v}"`' for v in get_args(annotation))
    if origin is tuple:
        return "array of " + type_text(get_args(annotation)[0])
    if origin is dict:
        return "table of " + type_text(get_args(annotation)[1])
    if _model(annotation) is not None:
        return f"table ([{annotation.__name__}](#{annotation.__name__.lower()}))"
    for base, name in _SCALARS.items():
        if inspect.isclass(annotation) and issubclass(annotation, base):
            return name + _bounds(metadata)
    return getattr(annotation, "__name__", str(annotation)) + _bounds(metadata)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "optional"
    if isinstance(value, BaseModel):
        return "its defaults"
    return f"`{value!r}`".replace("'", '"')


def _nested(annotation: Any, table: str) -> list[tuple[type[BaseModel], str]]:
    """The models a key's type holds, each with its table's TOML name (`table` is the key's:
    a table of tables adds ".<name>", an array of tables is "[[…]]")."""
    annotation, _ = _parts(annotation)
    if (model := _model(annotation)) is not None:
        return [(model, table)]
    origin = get_origin(annotation)
    if origin is dict:
        return _nested(get_args(annotation)[1], f"{table}.<name>")
    if origin is tuple:
        return _nested(get_args(annotation)[0], f"{table}[]")
    return [found for arg in get_args(annotation) for found in _nested(arg, table)]


def _toml_name(table: str) -> str:
    return f"[[{table[:-2]}]]" if table.endswith("[]") else f"[{table}]" if table else "top level"


def _section(model: type[BaseModel], table: str) -> list[str]:
    doc = inspect.cleandoc(model.__doc__ or "").replace("\n", " ").replace("``", "`")
    # A docstring that starts with its table's name says it; others get it said first.
    said = doc if doc.startswith("`[") else f"`{_toml_name(table)}`: {doc}"
    lines = [f"### {model.__name__}", "", said, "",
             "| key | type | default |", "|---|---|---|"]  # fmt: skip
    for key, field in model.model_fields.items():
        lines.append(f"| `{field.alias or key}` | {type_text(field.annotation, field.metadata)} | "
                     f"{_default(field)} |")  # fmt: skip
    return [*lines, ""]


def _sections(roots: list[tuple[type[BaseModel], str]], seen: set[type[BaseModel]]) -> list[str]:
    """The sections of `roots` and of every model they hold, each once (`seen` are done)."""
    lines: list[str] = []
    queue = list(roots)
    while queue:
        model, title = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        lines += _section(model, title)
        for key, field in model.model_fields.items():
            name = field.alias or key
            queue += _nested(field.annotation, f"{title}.{name}" if title else name)
    return lines


def render() -> str:
    """The whole page."""
    seen: set[type[BaseModel]] = set()
    lines = [
        "# The manifest",
        "",
        "Generated from the models (`python -m release.manifest.reference --write`; do not edit",
        "by hand). `python -m release check-manifest` validates a manifest against them; each",
        "problem is one line, `<file>: <key>: expected …; got …`.",
        "",
        *_sections([(Manifest, "")], seen),
        "## The gates",
        "",
        "`[gates.<name>]` holds the keys of its gate's own model (release/catalogue.py):",
        "",
        "| gate | runner | table |",
        "|---|---|---|",
    ]
    for name, entry in catalogue.GATES.items():
        model = entry.settings.__name__
        lines.append(f"| `{name}` | `{entry.runner}` | [{model}](#{model.lower()}) |")
    lines.append("")
    gates = [(entry.settings, f"gates.{name}") for name, entry in catalogue.GATES.items()]
    lines += _sections(gates, seen)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(REPO_ROOT)}")
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        atomic_write(PAGE, page.encode())
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
