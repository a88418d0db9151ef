"""The report document as Markdown (`<out>/report.md`)."""

from __future__ import annotations

import re

from release.report.model import Cell, Document, Figure, Table, Text


def _one_cell_line(text: str) -> str:
    """`text` kept on one line and inside one table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _md_escape(text: str) -> str:
    """Text from records (wheel names, messages) as Markdown text: a viewer renders raw HTML in
    Markdown, so none may start here."""
    return _one_cell_line(text.replace("&", "&amp;").replace("<", "&lt;"))  # no tag nor entity


def _md_cell(cell: Cell) -> str:
    parts = [cell.text] if cell.text else []
    parts += list(cell.lines)
    if cell.tone == "code" and not cell.lines and cell.text:
        # A code span shows its text literally (no HTML); a backtick inside would end it early.
        code = _one_cell_line(cell.text)
        longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
        fence = "`" * (longest + 1)
        return f"{fence} {code} {fence}" if longest else f"`{code}`"
    return "<br>".join(_md_escape(p) for p in parts)


def table_lines(table: Table) -> list[str]:
    """A table as Markdown lines: headers, the rule, one line per row."""
    lines = ["| " + " | ".join(_md_escape(h) for h in table.headers) + " |"]
    lines.append("|" + "---|" * len(table.headers))
    return lines + ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]


def render(document: Document) -> str:
    out = [f"# {_md_escape(document.title)}", "", f"_{_md_escape(document.subtitle)}_", ""]
    out.append(
        " · ".join(
            f"**{_md_escape(label)}** {_md_escape(value)}" for label, value, _ in document.overview
        )
    )
    out.append("")
    for section in document.sections:
        out += [f"## {_md_escape(section.title)}", ""]
        for block in section.blocks:
            if isinstance(block, Text):
                out += [_md_escape(block.text), ""]
            elif isinstance(block, Figure):
                out += [f"![{_md_escape(block.alt)}]({block.file_name})", ""]
            else:
                out += [*table_lines(block), ""]
    return "\n".join(out)
