"""The report document as Markdown (`<out>/report.md`)."""

from __future__ import annotations

import re

from release.report.model import Cell, Document, Figure, Table, Text, code_spans

# Inline Markdown a record's text could start by accident; `_` only where it is not inside a
# word (manylinux_2_28_x86_64 stays as it is: CommonMark never takes that as emphasis), `]` only
# where a link would start ("[1, 2]" stays as it is: no link without its "(…)").
_MARKUP = re.compile(r"[\\`*~|]|\](?=\()|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# What would make a paragraph a heading, quote, list or rule.
_BLOCK_START = re.compile(r"^(?:[#>+=-]|\d+[.)])")


def _plain(text: str) -> str:
    """Text from records (wheel names, messages) as literal Markdown text: no markup of its own
    and no raw HTML (a viewer renders raw HTML in Markdown)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;")  # no tag nor entity
    return _MARKUP.sub(lambda found: "\\" + found.group(), text).replace("\n", " ")


def code_span(code: str, cell: bool = False) -> str:
    """`code` as one Markdown code span showing it literally (in a table `cell` too): the fence
    is longer than any run of backticks inside, padded where CommonMark would strip a space."""
    code = code.replace("\n", " ")
    if cell:
        code = code.replace("|", "\\|")  # GFM: a pipe ends a cell even inside code
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * (longest + 1)
    # CommonMark strips one space each side of a span that is not all spaces.
    edges = code.startswith(("`", " ")) or code.endswith(("`", " "))
    padded = bool(code.strip(" ")) and (longest > 0 or edges)
    return f"{fence} {code} {fence}" if padded else f"{fence}{code}{fence}"


def inline(text: str, cell: bool = False) -> str:
    """`text` as Markdown on one line (of a table `cell`): its code spans (`like this`) as code,
    the rest literal."""
    return "".join(code_span(part, cell) if code else _plain(part)
                   for part, code in code_spans(text))  # fmt: skip


def _paragraph(text: str) -> str:
    shown = inline(text)
    return "\\" + shown if _BLOCK_START.match(shown) else shown


def _md_cell(cell: Cell) -> str:
    if cell.tone == "code" and not cell.lines and cell.text:
        return code_span(cell.text, cell=True)  # the whole cell is code (a wheel name, a digest)
    parts = [cell.text] if cell.text else []
    parts += list(cell.lines)
    return "<br>".join(inline(p, cell=True) for p in parts)


def table_lines(table: Table) -> list[str]:
    """A table as Markdown lines: headers, the rule, one line per row."""
    lines = ["| " + " | ".join(inline(h, cell=True) for h in table.headers) + " |"]
    lines.append("|" + "---|" * len(table.headers))
    return lines + ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]


def render(document: Document) -> str:
    out = [f"# {inline(document.title)}", "", f"_{inline(document.subtitle)}_", ""]
    for index, line in enumerate(document.verdict):  # the headline first, in bold
        out += [f"**{inline(line.text)}**" if index == 0 else _paragraph(line.text), ""]
    out.append(
        " · ".join(f"**{inline(label)}** {inline(value)}" for label, value, _ in document.overview)
    )
    out.append("")
    for section in document.sections:
        out += [f"## {inline(section.title)}", ""]
        for block in section.blocks:
            if isinstance(block, Text):
                out += [_paragraph(block.text), ""]
            elif isinstance(block, Figure):
                out += [f"![{inline(block.alt)}]({block.file_name})", ""]
            else:
                out += [*table_lines(block), ""]
    return "\n".join(out)
