"""GitHub Actions expressions (``${{ ... }}``) as the replay evaluates them.

The forms the generator writes, and no more: literals (``'text'``, numbers, ``true``,
``false``, ``null``), context properties (``matrix.python``, ``inputs.channel``,
``secrets.NAME``, ``github.event_name``, ``env.CHANNEL``, ``needs.wheels.result``), the operators
``!``, ``==``, ``!=``, ``&&``, ``||`` and parentheses, and the functions ``cancelled()``,
``always()``, ``success()``, ``failure()``, ``contains(a, b)`` and ``fromJSON(text)``.

Anything else (another function, an index ``a[0]``, a comparison ``<``, a context the case at
hand does not hold) is refused with an :class:`ExpressionError` naming it: the replay never
guesses what a condition means.

The semantics are GitHub's: ``&&`` and ``||`` give one of their operands, ``==`` compares
strings case-insensitively and converts operands of different types to numbers, and a value
interpolated into a string is ``''`` for null and ``true``/``false`` for booleans.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from release.errors import ReleaseError


class ExpressionError(ReleaseError):
    """An expression the replay cannot evaluate; the message names it and why."""


@dataclass(frozen=True)
class Status:
    """What the status functions answer for the step or job at hand."""

    failed: bool = False  # an earlier step (or a needed job) failed
    cancelled: bool = False


_TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<number>-?\d+(?:\.\d+)?)"
    r"|(?P<op>==|!=|&&|\|\||!|\(|\)|,|\.)|(?P<name>[A-Za-z_][A-Za-z0-9_-]*))"
)
_FUNCTIONS = frozenset({"cancelled", "always", "success", "failure", "contains", "fromjson"})
_EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        if not text[position:].strip():
            break
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ExpressionError(
                f"{text.strip()!r}: expected an expression of the forms the "
                f"replay knows; got {text[position:].strip()[:20]!r}"
            )
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent: or > and > equality > unary > primary (GitHub's precedence)."""

    def __init__(self, text: str, contexts: Mapping[str, Any], status: Status) -> None:
        self.text = text.strip()
        self.tokens = _tokens(text)
        self.index = 0
        self.contexts = contexts
        self.status = status

    def fail(self, what: str) -> ExpressionError:
        return ExpressionError(f"{self.text!r}: {what}")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise self.fail(f"expected {value or 'more'}; got {token[1] if token else 'the end'}")
        self.index += 1
        return token

    def parse(self) -> Any:
        value = self.disjunction()
        if self.peek() is not None:
            raise self.fail(f"expected the end; got {self.peek()[1]!r}")  # type: ignore[index]
        return value

    def disjunction(self) -> Any:
        value = self.conjunction()
        while self.peek() == ("op", "||"):
            self.take()
            right = self.conjunction()
            value = value if truthy(value) else right
        return value

    def conjunction(self) -> Any:
        value = self.equality()
        while self.peek() == ("op", "&&"):
            self.take()
            right = self.equality()
            value = right if truthy(value) else value
        return value

    def equality(self) -> Any:
        value = self.unary()
        while self.peek() in (("op", "=="), ("op", "!=")):
            _, op = self.take()
            same = equal(value, self.unary())
            value = same if op == "==" else not same
        return value

    def unary(self) -> Any:
        if self.peek() == ("op", "!"):
            self.take()
            return not truthy(self.unary())
        return self.primary()

    def primary(self) -> Any:
        kind, value = self.take()
        if kind == "string":
            return value[1:-1].replace("''", "'")
        if kind == "number":
            return float(value) if "." in value else int(value)
        if value == "(":
            inner = self.disjunction()
            self.take(")")
            return inner
        if kind != "name":
            raise self.fail(f"expected a value; got {value!r}")
        if value in ("true", "false"):
            return value == "true"
        if value == "null":
            return None
        if self.peek() == ("op", "("):
            return self.call(value)
        return self.property(value)

    def call(self, name: str) -> Any:
        if name.lower() not in _FUNCTIONS:
            raise self.fail(
                f"function {name}() is not one the replay evaluates "
                f"({', '.join(sorted(_FUNCTIONS))})"
            )
        self.take("(")
        arguments: list[Any] = []
        while self.peek() != ("op", ")"):
            if arguments:
                self.take(",")
            arguments.append(self.disjunction())
        self.take(")")
        functions: dict[str, Callable[..., Any]] = {
            "cancelled": lambda: self.status.cancelled,
            "always": lambda: True,
            "success": lambda: not self.status.failed and not self.status.cancelled,
            "failure": lambda: self.status.failed,
            "contains": _contains,
            "fromjson": _from_json,
        }
        try:
            return functions[name.lower()](*arguments)
        except TypeError:
            raise self.fail(f"{name}() takes other arguments than {len(arguments)}") from None

    def property(self, name: str) -> Any:
        if name not in self.contexts:
            raise self.fail(
                f"context {name!r} is not one the replay holds here "
                f"({', '.join(sorted(self.contexts))})"
            )
        value = self.contexts[name]
        path = name
        while self.peek() == ("op", "."):
            self.take()
            _, key = self.take()
            path += f".{key}"
            if not isinstance(value, Mapping):
                raise self.fail(f"{path}: {path.rpartition('.')[0]} is not an object")
            if name in ("inputs", "matrix", "needs", "github", "steps") and key not in value:
                raise self.fail(
                    f"{path} is not set for this run (it holds "
                    f"{', '.join(sorted(value)) or 'nothing'})"
                )
            value = value.get(key)  # an unset env or secret is null, as on GitHub
        return value


def _contains(search: Any, item: Any) -> bool:
    if isinstance(search, list):
        return any(equal(element, item) for element in search)
    return to_string(item).lower() in to_string(search).lower()


def _from_json(text: Any) -> Any:
    try:
        return json.loads(to_string(text))
    except json.JSONDecodeError as error:
        raise ExpressionError(f"fromJSON({text!r}): expected JSON; {error}") from None


def truthy(value: Any) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return False
    return value not in (None, False, 0, "") if not isinstance(value, (list, dict)) else True


def _number(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip()) if value.strip() else 0.0
        except ValueError:
            return math.nan
    return math.nan


def equal(left: Any, right: Any) -> bool:
    """GitHub's `==`: strings case-insensitively; different types compared as numbers."""
    if isinstance(left, str) and isinstance(right, str):
        return left.lower() == right.lower()
    if type(left) is type(right) or {type(left), type(right)} <= {int, float}:
        return bool(left == right)
    if isinstance(left, (list, dict)) or isinstance(right, (list, dict)):
        return left is right
    return _number(left) == _number(right)


def to_string(value: Any) -> str:
    """A value as interpolation writes it into a string."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def evaluate(text: str, contexts: Mapping[str, Any], status: Status = Status()) -> Any:
    """The value of one expression (the text inside ``${{ }}``)."""
    return _Parser(text, contexts, status).parse()


def condition(text: str, contexts: Mapping[str, Any], status: Status = Status()) -> bool:
    """An ``if:`` as GitHub reads it: ``${{ }}`` optional; without a status function,
    ``success() &&`` is implied."""
    stripped = text.strip()
    match = re.fullmatch(r"\$\{\{(.*)\}\}", stripped, re.DOTALL)
    inner = match.group(1) if match else stripped
    if "${{" in inner:
        raise ExpressionError(f"{text!r}: expected one expression; got several")
    result = truthy(evaluate(inner, contexts, status))
    names = {value.lower() for kind, value in _tokens(inner) if kind == "name"}
    if not names & {"cancelled", "always", "success", "failure"}:
        result = result and not status.failed and not status.cancelled
    return result


def interpolate(text: str, contexts: Mapping[str, Any], status: Status = Status()) -> str:
    """``text`` with each ``${{ }}`` replaced by its value as a string."""
    return _EXPRESSION.sub(lambda m: to_string(evaluate(m.group(1), contexts, status)), text)


def interpolate_value(value: Any, contexts: Mapping[str, Any]) -> Any:
    """A YAML value (a string, or a list or mapping of them) with every string interpolated."""
    if isinstance(value, str):
        return interpolate(value, contexts)
    if isinstance(value, list):
        return [interpolate_value(item, contexts) for item in value]
    if isinstance(value, dict):
        return {key: interpolate_value(item, contexts) for key, item in value.items()}
    return value
