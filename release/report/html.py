"""The report document as one self-contained HTML page (`<out>/report.html`): inline CSS, figures
as data URIs."""

from __future__ import annotations

import base64
import html

from release.report.model import Cell, Document, Figure, Text, code_spans

_CSS = """
:root { --pass: #1a7f37; --pass-bg: #dafbe1; --fail: #cf222e; --fail-bg: #ffebe9;
  --skip: #9a6700; --skip-bg: #fff8c5; --line: #d0d7de; --muted: #57606a; }
* { box-sizing: border-box; }
body { font: 14px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif;
  color: #1f2328; margin: 0; background: #f6f8fa; }
main { max-width: 1280px; margin: 0 auto; padding: 24px 32px 48px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 32px 0 10px; padding-bottom: 6px;
  border-bottom: 1px solid var(--line); }
.subtitle { color: var(--muted); margin: 0 0 16px; }
.overview { display: flex; gap: 12px; flex-wrap: wrap; margin: 8px 0 8px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 8px 16px;
  min-width: 120px; }
.card .value { font-size: 22px; font-weight: 600; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase;
  letter-spacing: .04em; }
.card.pass .value { color: var(--pass); } .card.fail .value { color: var(--fail); }
.card.not-run .value { color: var(--skip); }
nav { margin: 8px 0 0; font-size: 13px; } nav a { margin-right: 14px; color: #0969da; }
table { border-collapse: collapse; width: 100%; background: #fff; margin: 6px 0 10px;
  border: 1px solid var(--line); }
th, td { border: 1px solid var(--line); padding: 6px 10px; text-align: left; vertical-align: top; }
th { background: #eaeef2; font-weight: 600; font-size: 13px; }
td.code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace;
  font-size: 12px; overflow-wrap: anywhere; }
td.name { white-space: nowrap; font-weight: 600; } td.nowrap { white-space: nowrap; }
td.pass { background: var(--pass-bg); color: var(--pass); }
td.fail { background: var(--fail-bg); color: var(--fail); }
td.not-run { background: var(--skip-bg); color: var(--skip); }
td ul { margin: 0; padding-left: 16px; } td li { margin: 1px 0; }
table.grid td { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; }
table.grid td:first-child { font-family: inherit; font-weight: 600; background: #eaeef2;
  color: inherit; }
table.grid ul { list-style: none; padding-left: 0; }
table.grid td.pass, table.grid td.fail, table.grid td.not-run { color: #1f2328; }
li.pass { color: var(--pass); } li.fail { color: var(--fail); font-weight: 600; }
li.not-run { color: var(--skip); font-weight: 600; }
p.pass { color: var(--pass); } p.fail { color: var(--fail); } p.not-run { color: var(--skip); }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12px;
  background: #eff1f3; border-radius: 4px; padding: 0 4px; }
td.code code, table.grid code { background: none; padding: 0; }
.verdict { font-size: 18px; font-weight: 600; margin: 4px 0 8px; padding: 8px 14px;
  border-left: 6px solid var(--line); background: #fff; }
.verdict.pass { border-color: var(--pass); color: var(--pass); }
.verdict.fail { border-color: var(--fail); color: var(--fail); }
.verdict.not-run { border-color: var(--skip); color: var(--skip); }
p.aside { color: var(--muted); margin: 0 0 12px; }
figure { margin: 8px 0; background: #fff; border: 1px solid var(--line); padding: 8px; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: var(--muted); font-size: 12px; text-align: center; }
"""


def inline(text: str) -> str:
    """`text` as HTML: its code spans (`like this`) as <code>, as a Markdown viewer shows them,
    the rest as text."""
    return "".join(f"<code>{html.escape(part)}</code>" if code else html.escape(part)
                   for part, code in code_spans(text))  # fmt: skip


def _html_cell(cell: Cell, header: bool = False) -> str:
    tag = "th" if header else "td"
    css = f' class="{cell.tone}"' if cell.tone else ""
    # A code cell is code as a whole (as the Markdown's one code span shows it).
    whole_code = cell.tone == "code" and not cell.lines
    body = html.escape(cell.text) if whole_code else inline(cell.text)
    if cell.lines:
        tones = cell.line_tones or ("",) * len(cell.lines)
        items = "".join(
            f'<li class="{tone}">{inline(line)}</li>' if tone else f"<li>{inline(line)}</li>"
            for line, tone in zip(cell.lines, tones, strict=True)
        )
        body += f"<ul>{items}</ul>"
    return f"<{tag}{css}>{body}</{tag}>"


def render(document: Document) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(document.title)}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>{inline(document.title)}</h1>",
        f'<p class="subtitle">{inline(document.subtitle)}</p>',
    ]
    for index, line in enumerate(document.verdict):  # the headline first
        css = f"verdict {line.tone}".strip() if index == 0 else "aside"
        out.append(f'<p class="{css}">{inline(line.text)}</p>')
    out.append('<div class="overview">')
    for label, value, tone in document.overview:
        out.append(
            f'<div class="card {tone}"><div class="value">{inline(value)}</div>'
            f'<div class="label">{inline(label)}</div></div>'
        )
    out.append("</div><nav>")
    out += [f'<a href="#{s.anchor}">{inline(s.title)}</a>' for s in document.sections]
    out.append("</nav>")
    for section in document.sections:
        out.append(f'<section id="{section.anchor}"><h2>{inline(section.title)}</h2>')
        for block in section.blocks:
            if isinstance(block, Text):
                css = f' class="{block.tone}"' if block.tone else ""
                out.append(f"<p{css}>{inline(block.text)}</p>")
            elif isinstance(block, Figure):
                data = base64.b64encode(block.png).decode("ascii")
                alt = html.escape(block.alt)
                out.append(
                    f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{alt}</figcaption></figure>"
                )
            else:
                css = ' class="grid"' if block.grid else ""
                out.append(f"<table{css}><thead><tr>")
                out += [_html_cell(Cell(h), header=True) for h in block.headers]
                out.append("</tr></thead><tbody>")
                for row in block.rows:
                    out.append("<tr>" + "".join(_html_cell(c) for c in row) + "</tr>")
                out.append("</tbody></table>")
        out.append("</section>")
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"
