"""The report as a document: sections of text, tables, grids and figures. Both renderers
(Markdown and HTML) draw exactly this, so the two files always say the same."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from markdown_it import MarkdownIt


@dataclass(frozen=True)
class Cell:
    text: str
    tone: str = ""  # "pass", "fail", "not-run" colour a cell; "code" sets it in monospace
    lines: tuple[str, ...] = ()  # several entries in one cell (the parity grid)
    line_tones: tuple[str, ...] = ()  # a tone per entry of `lines`, where they differ


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    grid: bool = False  # a matrix: the first column names the row


@dataclass(frozen=True)
class Text:
    text: str
    tone: str = ""


@dataclass(frozen=True)
class Figure:
    png: bytes
    file_name: str
    alt: str


Block = Table | Text | Figure


@dataclass
class Section:
    title: str
    anchor: str
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Document:
    title: str
    subtitle: str
    overview: list[tuple[str, str, str]]  # (label, value, tone)
    sections: list[Section]
    verdict: list[Text] = field(default_factory=list)  # the headline, before everything else


@cache
def _code_parser() -> MarkdownIt:
    # CommonMark's code spans and nothing else: the rest of a text is shown as it is.
    return MarkdownIt("zero").enable("backticks")


def code_spans(text: str) -> list[tuple[str, bool]]:
    """`text` as (part, is_code) in order: the code spans (`like this`) as CommonMark finds
    them, so both renderers show as code exactly what a Markdown viewer shows as code."""
    tokens = _code_parser().parseInline(text)
    children = (tokens[0].children or []) if tokens else []
    return [(child.content, child.type == "code_inline") for child in children]
