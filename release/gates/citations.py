"""Citations of shims: each line of Python a wheel ships names the framework line that needs it.

A shim is the only Python the payload allows (``[[payload.shims]]`` in the manifest). Every line of
a shim that is not blank and not only a comment ends with a citation comment, holding one citation
for each framework release the shim's manifest entry pins (``versions``), separated by ``;``:

    <code>  # cites: <distribution>==<version> <path>:<line> <hash>[; <distribution>==<version> ...]

* ``<distribution>==<version>``: the framework and one of its pinned releases, exactly as the
  shim's manifest entry names them;
* ``<path>:<line>``: a file inside that release's wheel (as ``pip download --no-deps`` fetches
  it) and a 1-based line number in that file;
* ``<hash>``: the first 8 hex digits of the sha256 of that line's UTF-8 text with its leading and
  trailing whitespace removed.

For example, citing ``class KVConnectorBase_V1(ABC):``, line 180 of
``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` in vLLM 0.32.0 and line 181 in 0.33.0
(paths shortened here)::

    class ActiveKVConnector(KVConnectorBase_V1):  # cites: vllm==0.32.0 vllm/…/base.py:180 9433fb97; vllm==0.33.0 vllm/…/base.py:181 9433fb97

The cited line is the framework source that requires the shim's line: the definition it
overrides or imports, or the call site that calls it. A line counts as code when Python's
tokenizer finds anything on it but a comment, so a string spanning lines (a docstring) makes lines
that cannot carry a citation: shims document themselves in comments.

``verify_shim`` checks a shim's citations against each pinned release's own files; every problem
names the shim file and line: an uncited or malformed line, another framework or a release the
manifest does not pin, a pinned release the line does not cite (or cites twice), a path missing
from that release, a line number past its end, or a hash that does not match the cited line (a
wrong line number or a line the framework changed).
"""  # noqa: E501

from __future__ import annotations

import ast
import hashlib
import io
import re
import tokenize
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

_CITATIONS = re.compile(r"#\s*cites:\s*(?P<citations>.*?)\s*")
_CITATION = re.compile(
    r"(?P<distribution>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)"
    r"\s+(?P<path>[^\s:]+):(?P<line>[1-9][0-9]*)\s+(?P<digest>[0-9a-f]{8})"
)
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}
FORMAT = (
    "# cites: <distribution>==<version> <path>:<line> <8 hex digits of sha256 of that line>, "
    "one per pinned version, separated by semicolons"
)


@dataclass(frozen=True)
class Citation:
    """One citation: shim line ``shim_line`` cites ``path:line`` of ``distribution==version``."""

    shim_line: int
    distribution: str
    version: str
    path: str
    line: int
    digest: str


@dataclass(frozen=True)
class CitationProblem:
    """Why one shim line fails; ``str()`` reads ``<shim>:<line>: <message>``."""

    shim: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.shim}:{self.line}: {self.message}"


def line_digest(text: str) -> str:
    """The citation hash of one framework line: 8 hex digits of sha256 of its stripped text."""
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()[:8]


# Names that run code from a string or reach the builtins around the citations: a cited line
# holding one could do anything its citation does not say.
_DYNAMIC_CODE = frozenset(
    {"exec", "eval", "compile", "__import__", "__builtins__", "builtins", "breakpoint"}
)


def _source_problems(shim: str, source: bytes) -> list[CitationProblem]:
    """What makes the lines Python compiles other than the lines read here: an encoding other
    than UTF-8 (a coding cookie such as utf-7 turns text into code), a lone carriage return (a
    line break to the compiler, none to a line reader), two statements on one line (one citation
    for both), and names that run code from strings."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        text = source.decode("utf-8-sig")
    except (SyntaxError, UnicodeDecodeError) as error:
        return [CitationProblem(shim, 1, f"expected UTF-8 Python source; got {error}")]
    if encoding not in ("utf-8", "utf-8-sig"):
        return [
            CitationProblem(shim, 1, f"expected UTF-8 source; its coding cookie says {encoding}")
        ]
    for number, line in enumerate(text.split("\n"), start=1):
        if "\r" in line.removesuffix("\r"):
            said = "expected lines ended by \\n or \\r\\n; got a lone \\r (a line break to Python)"
            return [CitationProblem(shim, number, said)]
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        return [CitationProblem(shim, error.lineno or 1, f"expected Python source; got {error}")]
    problems: list[CitationProblem] = []
    starts: dict[int, list[ast.stmt]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            starts.setdefault(node.lineno, []).append(node)
        named = (node.id if isinstance(node, ast.Name)
                 else node.name.split(".")[0] if isinstance(node, ast.alias)
                 else getattr(node, "attr", None))  # fmt: skip
        if named in _DYNAMIC_CODE:
            said = f"{named}: expected no code run from strings"
            problems.append(CitationProblem(shim, getattr(node, "lineno", 1), said))
    for number, statements in sorted(starts.items()):
        if len(statements) > 1 and not _empty_body(statements):
            problems.append(CitationProblem(shim, number, "expected one statement per line (one "
                                            "citation cannot answer for two)"))  # fmt: skip
    return problems


def _empty_body(statements: list[ast.stmt]) -> bool:
    """A compound statement whose same-line body does nothing: ``class X(Base): pass``."""
    head, *rest = statements
    return isinstance(head, (ast.ClassDef, ast.FunctionDef)) and all(
        isinstance(s, ast.Pass)
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and s.value.value is ...)
        for s in rest
    )


def parse_shim(shim: str, source: bytes) -> tuple[list[Citation], list[CitationProblem]]:
    """The citations of every code line of ``source`` and the lines that have none."""
    if found := _source_problems(shim, source):
        return [], found
    problems: list[CitationProblem] = []
    code_lines: set[int] = set()
    comments: dict[int, str] = {}
    try:
        for token in tokenize.tokenize(io.BytesIO(source).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.string
            elif token.type not in _NOT_CODE:
                code_lines.update(range(token.start[0], token.end[0] + 1))
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError) as error:
        line = getattr(error, "lineno", None) or (error.args[1][0] if len(error.args) > 1 else 1)
        return [], [CitationProblem(shim, int(line), f"expected Python source; got {error}")]
    citations: list[Citation] = []
    for number in sorted(code_lines):
        comment = comments.get(number)
        if comment is None or "cites:" not in comment:
            problems.append(CitationProblem(shim, number, f"uncited line: expected {FORMAT!r}"))
            continue
        listed = _CITATIONS.fullmatch(comment)
        parts = [part.strip() for part in listed["citations"].split(";")] if listed else []
        matches = [_CITATION.fullmatch(part) for part in parts]
        if not parts or None in matches:
            problems.append(
                CitationProblem(
                    shim, number, f"malformed citation {comment!r}: expected {FORMAT!r}"
                )
            )
            continue
        citations += [
            Citation(
                number,
                match["distribution"],
                match["version"],
                match["path"],
                int(match["line"]),
                match["digest"],
            )
            for match in matches
            if match is not None
        ]
    return citations, problems


def pin_problems(
    shim: str, citations: list[Citation], framework: str, versions: Sequence[str]
) -> list[CitationProblem]:
    """Citations of another framework or of a release the manifest does not pin, and code lines
    that cite a pinned release other than exactly once."""
    pinned = ", ".join(f"{framework}=={v}" for v in versions)
    problems = [
        CitationProblem(
            shim,
            c.shim_line,
            f"cites {c.distribution}=={c.version}, but the manifest pins this shim to {pinned}",
        )
        for c in citations
        if canonicalize_name(c.distribution) != canonicalize_name(framework)
        or c.version not in versions
    ]
    for line in sorted({c.shim_line for c in citations}):
        cited = [c.version for c in citations if c.shim_line == line]
        for version in versions:
            if cited.count(version) != 1:
                times = "no" if version not in cited else f"{cited.count(version)}"
                problems.append(
                    CitationProblem(
                        shim,
                        line,
                        f"{times} citations of {framework}=={version}: expected exactly one for "
                        f"each pinned version ({pinned})",
                    )
                )
    return problems


def check_against_wheel(
    shim: str, citations: list[Citation], framework_wheel: Path
) -> list[CitationProblem]:
    """Each citation checked against the line it names in ``framework_wheel``."""
    problems: list[CitationProblem] = []
    files: dict[str, list[str] | None] = {}
    with zipfile.ZipFile(framework_wheel) as archive:
        members = set(archive.namelist())
        for c in citations:
            if c.path not in files:
                files[c.path] = (
                    archive.read(c.path).decode("utf-8", errors="replace").splitlines()
                    if c.path in members
                    else None
                )
            lines = files[c.path]
            where = f"{c.path}:{c.line}"
            if not c.path.endswith(".py"):
                message = f"cites {where}: expected a line of the framework's Python source"
            elif lines is None:
                message = f"cites {where}, but {framework_wheel.name} has no file {c.path}"
            elif c.line > len(lines):
                message = f"cites {where}, but {c.path} has only {len(lines)} lines"
            elif not lines[c.line - 1].strip() or lines[c.line - 1].strip().startswith("#"):
                message = (f"cites {where}, which is {lines[c.line - 1].strip()!r}: expected a "
                           "line of code, not a blank line or a comment")  # fmt: skip
            else:
                actual = line_digest(lines[c.line - 1])
                if actual == c.digest:
                    continue
                message = (
                    f"cites {where} with hash {c.digest}, but that line is "
                    f"{lines[c.line - 1].strip()!r} (hash {actual})"
                )
                elsewhere = [i + 1 for i, text in enumerate(lines) if line_digest(text) == c.digest]
                if elsewhere:
                    message += f"; the cited text is at line {elsewhere[0]} (wrong line number)"
                else:
                    message += "; no line of the file has the cited hash (changed line)"
            problems.append(CitationProblem(shim, c.shim_line, message))
    return problems


def verify_shim(
    shim: str,
    source: bytes,
    framework: str,
    versions: Sequence[str],
    framework_wheel: Callable[[str], Path] | None,
) -> list[CitationProblem]:
    """Every problem of one shim's citations. ``framework_wheel(version)`` fetches a pinned
    release's wheel for the line checks; it is not called when a citation names another release
    or a line misses one (fetching the pinned framework would prove nothing), and None skips the
    line checks."""
    citations, problems = parse_shim(shim, source)
    mismatched = pin_problems(shim, citations, framework, versions)
    problems += mismatched
    if framework_wheel is not None and not mismatched:
        for version in versions:
            cited = [c for c in citations if c.version == version]
            problems += check_against_wheel(shim, cited, framework_wheel(version))
    return sorted(problems, key=lambda p: p.line)
