"""Verify sees what pip sees: index pages are read as pip reads them (PEP 503 HTML and PEP 691
JSON, asked for with pip's Accept header), each link named as pip names it (the URL path's last
segment, unquoted, without query or fragment), and every file pip could take for the version on
any interpreter is judged: a wheel of any tag behind a query string, another spelling of the
name or the version, a source archive, a yanked file, a file of another Requires-Python.

A page server on 127.0.0.1 serves the page and the files; the planted file's bytes are not
signed, and verify must refuse it by name. A link with a fragment (another hash) still works,
through pip itself."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from bad_servers import pages, serving
from fixtures_wheels import build_wheel

from release.errors import VerifyError
from release.statement import Statement
from release.trust.index import SIMPLE_ACCEPT, pip_filename, project_files
from release.trust.served_files import check_served_files
from release.trust.verify import verify_from_index
from release.util.digests import sha256_file

HTML = b"text/html; charset=utf-8"
JSON = b"application/vnd.pypi.simple.v1+json"
IMPORTS = ["activekv._probe"]
PLANTED_WHEEL = "activekv-0.1.0-cp313-cp313-manylinux_2_28_x86_64.whl"


def _html(links: list[tuple[str, dict[str, str]]]) -> bytes:
    anchors = "".join(
        '<a href="{}"{}>{}</a><br/>\n'.format(
            href, "".join(f' {k}="{v}"' for k, v in attributes.items()), href.rsplit("/", 1)[-1]
        )
        for href, attributes in links
    )
    return f"<!DOCTYPE html><html><body>\n{anchors}</body></html>".encode()


def _json(links: list[tuple[str, dict[str, str]]]) -> bytes:
    files = []
    for href, attributes in links:
        entry: dict[str, object] = {"filename": href.rsplit("/", 1)[-1].split("?")[0], "url": href,
                                    "hashes": {}}  # fmt: skip
        if "data-yanked" in attributes:
            entry["yanked"] = attributes["data-yanked"] or True
        if "data-requires-python" in attributes:
            entry["requires-python"] = attributes["data-requires-python"]
        files.append(entry)
    document = {"meta": {"api-version": "1.0"}, "name": "activekv", "files": files}
    return json.dumps(document).encode()


RENDER: dict[str, tuple[bytes, Callable[[list[tuple[str, dict[str, str]]]], bytes]]] = {
    "pep503": (HTML, _html),
    "pep691": (JSON, _json),
}


def _signed(wheel: Path) -> dict[str, str]:
    return {wheel.name: sha256_file(wheel)}


def _site(
    tmp_path: Path, page: str, planted: list[tuple[str, Path, dict[str, str]]]
) -> tuple[dict[str, tuple[bytes, bytes]], Path]:
    """Routes serving the signed wheel and each planted (href, file, attributes) on a page."""
    wheel = build_wheel(tmp_path / "signed")
    content_type, render = RENDER[page]
    routes = {f"/packages/{wheel.name}": (b"application/octet-stream", wheel.read_bytes())}
    links = [(f"/packages/{wheel.name}#sha256={sha256_file(wheel)}", {})]
    for href, path, attributes in planted:
        routes[href.split("?")[0].split("#")[0]] = (b"application/octet-stream", path.read_bytes())
        links.append((href, attributes))
    routes["/simple/activekv/"] = (content_type, render(links))
    return routes, wheel


def _unsigned(tmp_path: Path, name: str) -> Path:
    """A file named ``name`` whose bytes no statement signs."""
    path = tmp_path / "planted" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".whl") and name.count("-") == 4:
        tag = name.split("-", 2)[2].removesuffix(".whl")
        built = build_wheel(tmp_path / "built", tag=tag, salt="planted")
        path.write_bytes(built.read_bytes())
    else:
        path.write_bytes(b"not signed")
    return path


_CP312 = "ActiveKV-0.1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
_CP311 = "activekv-0.1-cp311-cp311-manylinux_2_28_x86_64.whl"
_SLASHED = "activekv-0.1.0-py2.py3-none-any.whl"
PLANTED = [
    pytest.param(f"/packages/{PLANTED_WHEEL}?v=1", {}, PLANTED_WHEEL, id="query"),
    pytest.param(f"/packages/{PLANTED_WHEEL}?v=1#sha256={'0' * 64}", {}, PLANTED_WHEEL,
                 id="query-and-fragment"),
    pytest.param(f"/packages/{_CP312}", {}, _CP312, id="name-spelling"),
    pytest.param(f"/packages/{_CP311}", {}, _CP311, id="version-spelling"),
    pytest.param("/packages/Active_KV-0.1.0.tar.gz", {}, None, id="other-project"),
    pytest.param("/packages/activekv-0.1.0.tar.gz", {}, "activekv-0.1.0.tar.gz", id="sdist"),
    pytest.param("/packages/active.kv-0.1.zip", {}, None, id="zip-of-other-project"),
    pytest.param("/packages/ActiveKV-0.1.zip", {}, "ActiveKV-0.1.zip", id="zip-sdist"),
    pytest.param(f"/packages/{PLANTED_WHEEL}", {"data-yanked": "broken"}, PLANTED_WHEEL,
                 id="yanked"),
    pytest.param(f"/packages/{PLANTED_WHEEL}", {"data-requires-python": ">=4"}, PLANTED_WHEEL,
                 id="requires-python"),
    pytest.param(f"/packages/a%2F{_SLASHED}", {}, _SLASHED, id="quoted-slash"),
    pytest.param("/packages/stray.whl#egg=activekv-0.1.0", {}, "stray.whl", id="egg-fragment"),
]  # fmt: skip


@pytest.mark.parametrize("page", sorted(RENDER))
@pytest.mark.parametrize(("href", "attributes", "refused"), PLANTED)
def test_every_file_pip_could_take_for_the_version_is_judged(
    tmp_path: Path, page: str, href: str, attributes: dict[str, str], refused: str | None
) -> None:
    name = pip_filename(href)
    routes, wheel = _site(tmp_path, page, [(href, _unsigned(tmp_path, name), attributes)])
    with serving(pages(routes)) as base:
        check = lambda: check_served_files(  # noqa: E731
            simple_url=base + "/simple/", project="activekv", version="0.1.0",
            signed=_signed(wheel), folder=tmp_path / "served",
        )  # fmt: skip
        if refused is None:  # not a file of activekv 0.1.0 to pip: not judged
            assert check() == _signed(wheel)
            return
        with pytest.raises(VerifyError) as caught:
            check()
    message = str(caught.value)
    assert message.startswith(f"{refused} (sha256 "), message
    assert "is not in the signed statement" in message and "\n" not in message


@pytest.mark.parametrize("page", sorted(RENDER))
def test_the_signed_file_behind_a_query_with_other_bytes_is_refused(
    tmp_path: Path, page: str
) -> None:
    """The same name as the signed wheel, twice: which would pip take? Neither is judged apart."""
    signed_name = build_wheel(tmp_path / "probe").name
    href = f"/other/{signed_name}?v=1"
    routes, wheel = _site(tmp_path, page, [(href, _unsigned(tmp_path, signed_name), {})])
    twice = rf"lists {wheel.name} twice.*expected one file of a name"
    with serving(pages(routes)) as base, pytest.raises(VerifyError, match=twice):
        check_served_files(simple_url=base + "/simple/", project="activekv", version="0.1.0",
                           signed=_signed(wheel), folder=tmp_path / "served")  # fmt: skip


def test_pages_are_asked_for_as_pip_asks() -> None:
    seen: list[bytes] = []
    handler = pages({"/simple/activekv/": (JSON, _json([]))})

    def record(connection: object, request: bytes) -> None:
        seen.append(request)
        handler(connection, request)  # type: ignore[arg-type]

    with serving(record) as base:
        assert project_files(base + "/simple/", "activekv") == []
    assert f"Accept: {SIMPLE_ACCEPT}\r\n".encode() in seen[0]
    assert SIMPLE_ACCEPT.startswith("application/vnd.pypi.simple.v1+json, ")


def test_a_page_pip_would_not_read_is_refused() -> None:
    routes = {"/simple/activekv/": (b"application/octet-stream", b"<a href='x.whl'>x</a>")}
    with serving(pages(routes)) as base, pytest.raises(VerifyError, match=r"expected a PEP 503 "
                                                       r"\(text/html\) or PEP 691"):  # fmt: skip
        check_served_files(simple_url=base + "/simple/", project="activekv", version="0.1.0",
                           signed={}, folder=Path("/nonexistent"))  # fmt: skip


@pytest.mark.parametrize(
    "url",
    [
        "https://h/p/activekv-0.1.0-py3-none-any.whl?v=1",
        "https://h/p/activekv-0.1.0-py3-none-any.whl#sha256=00",
        "https://h/p/activekv-0.1.0-py3-none-any.whl?v=1#md5=00",
        "https://h/p/x%2Factivekv-0.1.0.tar.gz",
        "https://h/p/activekv%2D0.1.0.zip",
        "https://h/p/activekv-0.1.0.tar.gz/",
        "https://h/p/caf%C3%A9-1.0.tar.gz",
        "https://h/p/activekv 0.1.0.tar.gz",
    ],
)
def test_a_link_is_named_as_pip_names_it(url: str) -> None:
    from pip._internal.models.link import Link  # pip itself is the reference here

    assert pip_filename(url) == Link(url).filename


# ------------------------------------------------------------------------------ through pip


@pytest.mark.integration
@pytest.mark.parametrize("page", sorted(RENDER))
def test_a_link_with_another_hash_in_its_fragment_verifies_and_installs(
    tmp_path: Path, page: str
) -> None:
    wheel = build_wheel(tmp_path / "signed")
    content_type, render = RENDER[page]
    digest = hashlib.sha512(wheel.read_bytes()).hexdigest()
    routes = {
        f"/packages/{wheel.name}": (b"application/octet-stream", wheel.read_bytes()),
        "/simple/activekv/": (
            content_type,
            render([(f"/packages/{wheel.name}#sha512={digest}", {})]),
        ),
    }
    statement = {"subject": [{"name": wheel.name, "digest": {"sha256": sha256_file(wheel)}}]}
    with serving(pages(routes)) as base:
        verified = verify_from_index(
            simple_url=base + "/simple/", project="activekv", version="0.1.0",
            statement=Statement(statement), interpreters=[Path(sys.executable)], imports=IMPORTS,
            workdir=tmp_path / "verify",
        )  # fmt: skip
    assert verified.files == _signed(wheel)
    assert [check.wheel for check in verified.checks] == [wheel.name]
