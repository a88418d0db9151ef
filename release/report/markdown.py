"""The report document as Markdown (`<out>/report.md`)."""

from __future__ import annotations

from release.report.model import Cell, Document, Figure, Table, Text


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_cell(cell: Cell) -> str:
    parts = [cell.text] if cell.text else []
    parts += list(cell.lines)
    text = "<br>".join(_md_escape(p) for p in parts)
    return f"`{text}`" if cell.tone == "code" and not cell.lines and text else text


def table_lines(table: Table) -> list[str]:
    """A table as Markdown lines: headers, the rule, one line per row."""
    lines = ["| " + " | ".join(_md_escape(h) for h in table.headers) + " |"]
    lines.append("|" + "---|" * len(table.headers))
    return lines + ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]


def render(document: Document) -> str:
    out = [f"# {document.title}", "", f"_{document.subtitle}_", ""]
    out.append(" · ".join(f"**{label}** {value}" for label, value, _ in document.overview))
    out.append("")
    for section in document.sections:
        out += [f"## {section.title}", ""]
        for block in section.blocks:
            if isinstance(block, Text):
                out += [block.text, ""]
            elif isinstance(block, Figure):
                out += [f"![{block.alt}]({block.file_name})", ""]
            else:
                out += [*table_lines(block), ""]
    return "\n".join(out)
