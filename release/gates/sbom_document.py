"""An SBOM as a document: unambiguous JSON (no repeated key, no NaN) and valid CycloneDX 1.6,
its schema problem said in one line, and the small readings every SBOM check shares. The payload
gate's SBOM check (release/gates/sbom.py) reads every wheel's SBOM through it."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from release.util.jsonfile import JsonFileError, refuse_constant

SHA256 = re.compile(r"[0-9a-f]{64}")


Component = dict[str, Any]


class _RepeatedKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = Counter(key for key, _ in pairs)
    if repeated := [key for key, count in keys.items() if count > 1]:
        raise _RepeatedKey(repeated[0])
    return dict(pairs)


def read_document(data: bytes) -> tuple[dict[str, Any], str]:
    """The parsed document, or the problem that stops it from being judged."""
    try:
        text = data.decode("utf-8")
        document = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=refuse_constant)
    except UnicodeDecodeError as error:
        return {}, f"not UTF-8: expected UTF-8 JSON; got {error.reason} at byte {error.start}"
    except _RepeatedKey as error:
        return {}, f"ambiguous JSON: expected each key once in an object; got {str(error)!r} twice"
    except JsonFileError as error:  # NaN or Infinity
        return {}, f"not JSON: {error}"
    except RecursionError:
        return {}, "not JSON this gate can read: expected a document; got nesting too deep"
    except ValueError as error:
        return {}, f"not JSON ({error})"
    if problem := _schema_problem(text):
        return {}, problem
    if document.get("specVersion") != "1.6":
        return {}, f"specVersion: expected 1.6; got {document.get('specVersion')!r}"
    return document, ""


def clip(text: str, limit: int) -> str:
    """`text`, its middle left out when longer than `limit`."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]} … {text[-limit // 2 :]}"


def _schema_problem(text: str) -> str:
    try:
        error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    except RecursionError:
        return (
            "does not validate against the CycloneDX 1.6 schema: expected a document the "
            "validator can read; got nesting too deep"
        )
    if error is None:
        return ""
    detail = str(getattr(error.data, "message", error.data))
    shown = repr(getattr(error.data, "instance", None))
    if detail.startswith(shown):  # "<instance> is not …": the instance clipped, the reason kept
        detail = clip(shown, 120) + clip(detail[len(shown) :], 400)
    else:
        detail = clip(detail, 520)
    where = "/".join(str(part) for part in getattr(error.data, "absolute_path", ())) or "the top"
    return f"does not validate against the CycloneDX 1.6 schema at {where}: {detail}"


def repeated(values: list[Any]) -> list[tuple[Any, int]]:
    return [(value, count) for value, count in Counter(values).items() if count > 1]


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
