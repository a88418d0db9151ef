"""Uploads through twine's API in this process, and the credential probe on the same HTTP stack
(release/trust/twine_upload.py): real servers on 127.0.0.1 (the stdlib's HTTP server recording
what it is sent, over TLS too, and the embedded pypiserver) and real twine. A refused upload is
one line of what the index said, a reply past [publish.limits] stops at the limit, a redirect is
refused, and the TLS settings twine would take (TWINE_CERT, a .pypirc ca_cert) reach both the
probe and the upload."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import certifi
import pytest
from bad_servers import endless, serving
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fixtures_wheels import build_wheel
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import Version

from release.errors import PublishError
from release.manifest import NetworkLimits
from release.trust.index import EmbeddedIndex, list_project_files
from release.trust.release_version import file_version, normalize_project
from release.trust.remote_index import check_credentials, resolve_credentials
from release.trust.twine_config import Tls
from release.trust.twine_upload import server_text, upload
from release.util.digests import sha256_file

pytestmark = pytest.mark.integration  # real servers, real twine uploads

USER = "activekv-publisher"
PASSWORD = "the-right-one"


@dataclass
class Recorder:
    """What a server answers (status, headers, body; the ``earlier`` replies first, one a
    request) and what it was sent."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    earlier: list[tuple[int, bytes]] = field(default_factory=list)


@contextmanager
def recording(recorder: Recorder, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """A stdlib HTTP(S) server on 127.0.0.1 that reads each request whole and records it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            recorder.requests.append((self.path, dict(self.headers.items()), body))
            status, reply = (recorder.earlier.pop(0) if recorder.earlier
                             else (recorder.status, recorder.body))  # fmt: skip
            self.send_response(status)
            for name, value in {**recorder.headers, "Content-Length": str(len(reply)),
                                "Content-Type": "text/html"}.items():  # fmt: skip
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if tls else "http"
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------- twine's stack


def test_the_probe_and_the_upload_go_out_on_twines_session(tmp_path: Path) -> None:
    """Both carry twine's user agent and the credentials given (urllib's probe did not)."""
    wheel = build_wheel(tmp_path / "dist")
    recorder = Recorder(status=400, body=b"no file")
    with recording(recorder) as url:
        check_credentials(url, USER, PASSWORD)
        recorder.status, recorder.body = 200, b""
        upload(wheel, url, USER, PASSWORD)
    (_, probe_headers, _), (_, upload_headers, sent) = recorder.requests
    for headers in (probe_headers, upload_headers):
        assert headers["User-Agent"].startswith("twine/"), headers["User-Agent"]
        assert headers["Authorization"] == "Basic " + _basic(USER, PASSWORD)
    assert wheel.read_bytes() in sent and b'name="name"\r\n\r\nactivekv' in sent


def test_twines_own_variables_never_override_the_credentials_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, twine takes what it is given: a TWINE_PASSWORD meant for another index never
    reaches the embedded one (the old subprocess stripped them for that reason)."""
    monkeypatch.setenv("TWINE_USERNAME", "someone-else")
    monkeypatch.setenv("TWINE_PASSWORD", "for-pypi")
    monkeypatch.setenv("TWINE_REPOSITORY_URL", "https://upload.pypi.org/legacy/")
    wheel = build_wheel(tmp_path / "dist")
    recorder = Recorder()
    with recording(recorder) as url:
        upload(wheel, url, USER, PASSWORD)
    ((path, headers, _),) = recorder.requests
    assert path == "/" and headers["Authorization"] == "Basic " + _basic(USER, PASSWORD)


def _basic(user: str, password: str) -> str:
    import base64

    return base64.b64encode(f"{user}:{password}".encode()).decode()


# --------------------------------------------------------------------------- what it answered


_BOTTLE_507 = b"""<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">
<html><head><title>Error: 507 Insufficient Storage</title>
<style type="text/css">pre {background-color: #eee;}</style></head>
<body><h1>Error: 507 Insufficient Storage</h1>
<pre>cannot store x.whl in the index&#039;s package folder: No space left
on device (ENOSPC); nothing was kept; asked by the-right-one</pre></body></html>"""


def test_a_refused_upload_is_what_the_index_said_on_one_line(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    recorder = Recorder(status=507, body=_BOTTLE_507)
    with recording(recorder) as url, pytest.raises(PublishError) as caught:
        upload(wheel, url, USER, PASSWORD)
    assert str(caught.value) == (
        f"twine upload of {wheel.name} to {url} failed: the index answered 507 Insufficient "
        "Storage: cannot store x.whl in the index's package folder: No space left on device "
        "(ENOSPC); nothing was kept; asked by ********"
    )
    assert len(recorder.requests) == 5  # twine's own retries of a 5xx, as its command line


def test_a_plain_answer_is_kept_and_long_ones_are_cut(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    recorder = Recorder(status=409, body=b'{"message": "activekv-0.1.0.whl already exists"}')
    with recording(recorder) as url, pytest.raises(PublishError) as caught:
        upload(wheel, url, USER, PASSWORD)
    assert str(caught.value).endswith(
        'the index answered 409 Conflict: {"message": "activekv-0.1.0.whl already exists"}'
    )
    assert server_text("<p>Bad</p> <b>name&amp;</b>") == "Bad name&"
    assert len(server_text("x" * 5000)) == 400


def test_an_upload_whose_reply_never_ends_stops_at_the_page_cap(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    limits = NetworkLimits(page_bytes=1 << 20, deadline_s=30)
    with serving(endless()) as base, pytest.raises(PublishError) as caught:
        upload(wheel, base + "/", USER, PASSWORD, limits=limits)
    assert str(caught.value) == (f"{base}/: the reply exceeded 1 MiB (publish.limits.page_bytes "
                                 f"= {1 << 20}); stopped reading")  # fmt: skip


def test_a_redirect_is_refused_and_never_followed(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    elsewhere = Recorder()
    with recording(elsewhere) as there:
        moved = Recorder(status=301, headers={"Location": there})
        with recording(moved) as url:
            with pytest.raises(PublishError, match=rf"redirects \(HTTP 301\) to {there}; give"):
                upload(wheel, url, USER, PASSWORD)
            with pytest.raises(PublishError, match=rf"redirects \(HTTP 301\) to {there}; give"):
                check_credentials(url, USER, PASSWORD)
    assert elsewhere.requests == []  # the credentials never went there


def test_an_index_that_cannot_be_reached_is_named_in_its_own_words(tmp_path: Path) -> None:
    with recording(Recorder()) as url:
        pass  # stopped: its port now refuses connections
    with pytest.raises(PublishError) as caught:
        check_credentials(url, USER, PASSWORD)
    assert (
        str(caught.value) == f"{url} cannot be reached (Connection refused); nothing was uploaded"
    )


# ------------------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class Authority:
    ca_pem: Path
    server: ssl.SSLContext


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    """A private CA and a server certificate for 127.0.0.1 it signed, as an internal index has."""
    folder = tmp_path_factory.mktemp("ca")
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "activekv test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))  # fmt: skip
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # fmt: skip
    ca_pem = folder / "ca.pem"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = folder / "server.pem"
    chain.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
                      + cert.public_bytes(serialization.Encoding.PEM))  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    return Authority(ca_pem, context)


def test_a_pypirc_ca_cert_reaches_the_probe_and_the_upload(
    authority: Authority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index behind a private CA: refused with requests' own bundle (the control), reached
    with the ca_cert of its .pypirc section, on the probe and the upload alike, even where
    REQUESTS_CA_BUNDLE names another."""
    wheel = build_wheel(tmp_path / "dist")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("TWINE_CERT", raising=False)
    # requests would let this bundle (which lacks the private CA) win over the session's: the
    # section's ca_cert must win over it, as twine --cert's does not.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    recorder = Recorder(status=400, body=b"no file")
    with recording(recorder, authority.server) as url:
        with pytest.raises(PublishError, match=r"cannot be reached \(.*certificate verify failed"):
            check_credentials(url, USER, PASSWORD)
        with pytest.raises(PublishError, match=r"failed: .*certificate verify failed"):
            upload(wheel, url, USER, PASSWORD)
        (home / ".pypirc").write_text(
            f"[distutils]\nindex-servers = internal\n\n[internal]\nrepository = {url}\n"
            f"username = {USER}\npassword = {PASSWORD}\nca_cert = {authority.ca_pem}\n"
        )  # fmt: skip
        found = resolve_credentials(url, "bot", environ={"HOME": str(home)})
        assert found.tls == Tls(cacert=str(authority.ca_pem))
        check_credentials(url, found.username, found.password, tls=found.tls)
        recorder.status = 200
        upload(wheel, url, found.username, found.password)  # its TLS settings found the same way
        # TWINE_CERT is twine's other way to name it.
        env_tls = resolve_credentials(url, "bot", environ={"TWINE_CERT": str(authority.ca_pem),
                                                           "TWINE_PASSWORD": "x"}).tls  # fmt: skip
        check_credentials(url, USER, PASSWORD, tls=env_tls)
    assert len(recorder.requests) == 3


# ---------------------------------------------------------------------- the embedded pypiserver


def test_a_pypirc_section_publishes_to_a_real_pypiserver(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    home = tmp_path / "home"
    home.mkdir()
    with EmbeddedIndex(tmp_path / "state", USER) as index:
        pypirc = home / ".pypirc"
        pypirc.write_text(f"[distutils]\nindex-servers = mine\n\n[mine]\nrepository = "
                          f"{index.url}/\nusername = {USER}\npassword = wrong\n")  # fmt: skip
        refused = resolve_credentials(index.url, "bot", environ={"HOME": str(home)})
        with pytest.raises(PublishError) as caught:
            check_credentials(index.url, refused.username, refused.password,
                              source=refused.source)  # fmt: skip
        assert str(caught.value).startswith(
            f"{index.url} refused the credentials of user {USER!r} (HTTP 403), taken from the "
            f".pypirc section {pypirc} [mine]; check them"
        )
        pypirc.write_text(pypirc.read_text().replace("wrong", index.password))
        found = resolve_credentials(index.url, "bot", environ={"HOME": str(home)})
        check_credentials(index.url, found.username, found.password, source=found.source)
        upload(wheel, index.url, found.username, found.password)
        assert list_project_files(index.simple_url, "activekv") == {wheel.name: sha256_file(wheel)}


# ------------------------------------------------------------------------ packaging's names


def test_names_are_packagings_and_sdists_are_read_as_pip_reads_them() -> None:
    assert (
        normalize_project("ActiveKV__x.y") == canonicalize_name("ActiveKV__x.y") == "activekv-x-y"
    )
    # The documented exception: pip takes the version after the project's name, packaging's
    # parse_sdist_filename after the last "-" (and knows no .tar.bz2).
    assert file_version("activekv-0.1.0-1.tar.gz", "activekv") == Version("0.1.0.post1")
    assert parse_sdist_filename("activekv-0.1.0-1.tar.gz")[0] == "activekv-0-1-0"
    assert file_version("ActiveKV-0.1.tar.bz2", "activekv") == Version("0.1")
    with pytest.raises(InvalidSdistFilename):
        parse_sdist_filename("ActiveKV-0.1.tar.bz2")
