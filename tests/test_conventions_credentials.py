"""Credentials by the conventions a release engineer already has, in one documented precedence
(release/trust/remote_index.py): ACTIVEKV_INDEX_TOKEN, ACTIVEKV_INDEX_PASSWORD, twine's
TWINE_PASSWORD (with TWINE_USERNAME, scoped to TWINE_REPOSITORY_URL), the ~/.pypirc section of the
upload URL (twine's own parser), then keyring. Each source is planted alone and under the ones
above it; a wrong one is named in the error. HOME is a temporary folder, keyring real backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import null

from release.errors import PublishError
from release.trust.remote_index import (
    ENV_PASSWORD,
    ENV_TOKEN,
    ENV_USERNAME,
    find_credentials,
    resolve_credentials,
)
from release.trust.twine_config import Tls, same_url

URL = "https://index.example/releases/"
OTHER = "https://upload.pypi.org/legacy/"
SECRET = "s3cret-from-the-pypirc"


class Remembering(KeyringBackend):
    """A keyring that knows one password, for one service and user."""

    priority = 1  # type: ignore[assignment]

    def __init__(self, service: str, username: str, password: str) -> None:
        super().__init__()
        self.entry = (service, username, password)
        self.asked: list[tuple[str, str]] = []

    def get_password(self, service: str, username: str) -> str | None:
        self.asked.append((service, username))
        known_service, known_user, password = self.entry
        return password if (service, username) == (known_service, known_user) else None

    def set_password(self, service: str, username: str, password: str) -> None:
        raise NotImplementedError

    def delete_password(self, service: str, username: str) -> None:
        raise NotImplementedError


@pytest.fixture(autouse=True)
def _null_keyring() -> Iterator[None]:
    before = keyring.get_keyring()
    keyring.set_keyring(null.Keyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def _pypirc(home: Path, body: str) -> Path:
    path = home / ".pypirc"
    path.write_text(body, encoding="utf-8")
    return path


_SECTION = f"""\
[distutils]
index-servers =
    pypi
    internal

[pypi]
username = __token__
password = pypi-not-this-one

[internal]
repository = {URL.rstrip("/")}
username = pypirc-user
password = {SECRET}
ca_cert = /etc/ssl/internal-ca.pem
client_cert = /etc/ssl/me.pem
"""


def _resolve(home: Path, **environ: str):
    return resolve_credentials(URL, "bot", environ={"HOME": str(home), **environ})


# ------------------------------------------------------------------------- each source alone


def test_nothing_anywhere_names_every_source(home: Path) -> None:
    with pytest.raises(PublishError) as caught:
        _resolve(home)
    message = str(caught.value)
    assert message.startswith(f"publishing to {URL} needs credentials: set {ENV_TOKEN}")
    for source in (ENV_PASSWORD, ENV_USERNAME, "TWINE_PASSWORD", "TWINE_USERNAME",
                   str(home / ".pypirc"), "keyring"):  # fmt: skip
        assert source in message, source
    assert "\n" not in message


def test_twine_variables_are_honoured(home: Path) -> None:
    found = _resolve(home, TWINE_USERNAME="ci-user", TWINE_PASSWORD="twine-pw")
    assert (found.username, found.password) == ("ci-user", "twine-pw")
    assert found.source == "TWINE_PASSWORD with the user of TWINE_USERNAME"
    # Without TWINE_USERNAME the manifest's user, as for ACTIVEKV_INDEX_PASSWORD.
    alone = _resolve(home, TWINE_PASSWORD="twine-pw")
    assert (alone.username, alone.source) == ("bot", "TWINE_PASSWORD with the user of "
                                                     "publish.username")  # fmt: skip


def test_twine_variables_for_this_repository_url_are_honoured(home: Path) -> None:
    # The same endpoint however spelled: no trailing slash, upper-case host, default port.
    spelled = "https://INDEX.example:443/releases"
    assert same_url(spelled, URL)
    found = _resolve(home, TWINE_REPOSITORY_URL=spelled, TWINE_PASSWORD="twine-pw")
    assert found.password == "twine-pw"


def test_the_user_and_password_of_twine_repository_url_are_honoured(home: Path) -> None:
    found = _resolve(home, TWINE_REPOSITORY_URL="https://url-user:url%40pw@index.example/releases/")
    assert (found.username, found.password) == ("url-user", "url@pw")
    assert found.source == "the user and password of TWINE_REPOSITORY_URL"


def test_a_twine_repository_url_of_another_index_is_refused_not_followed(home: Path) -> None:
    """twine would send TWINE_PASSWORD to TWINE_REPOSITORY_URL: sending it to the manifest's
    index instead, or ignoring it silently, is what this plants against."""
    with pytest.raises(PublishError) as caught:
        _resolve(home, TWINE_REPOSITORY_URL=OTHER, TWINE_PASSWORD="for-pypi")
    message = str(caught.value)
    assert message.startswith(f"TWINE_REPOSITORY_URL is {OTHER}, but the release uploads to {URL}")
    assert "for-pypi" not in message and "\n" not in message
    # Named without its userinfo, whose password is a TWINE_* credential too.
    with pytest.raises(PublishError) as named:
        _resolve(home, TWINE_REPOSITORY_URL="https://u:hunter2@elsewhere.example/")
    assert "hunter2" not in str(named.value)
    assert str(named.value).startswith("TWINE_REPOSITORY_URL is https://elsewhere.example/, ")


def test_the_pypirc_section_of_the_upload_url_is_honoured(home: Path) -> None:
    path = _pypirc(home, _SECTION)
    found = _resolve(home)
    assert (found.username, found.password) == ("pypirc-user", SECRET)
    assert found.source == f"the .pypirc section {path} [internal]"
    # twine's TLS settings of that section, TWINE_CERT over its ca_cert.
    assert found.tls == Tls("/etc/ssl/internal-ca.pem", "/etc/ssl/me.pem")
    assert _resolve(home, TWINE_CERT="/ca.pem", ACTIVEKV_INDEX_TOKEN="t").tls == Tls(
        "/ca.pem", "/etc/ssl/me.pem"
    )


def test_server_login_defaults_reach_a_section_without_its_own(home: Path) -> None:
    _pypirc(home, f"[distutils]\nindex-servers = internal\n\n[server-login]\nusername = old\n"
                  f"password = legacy-pw\n\n[internal]\nrepository = {URL}\n")  # fmt: skip
    found = _resolve(home)
    assert (found.username, found.password) == ("old", "legacy-pw")


def test_a_pypirc_without_a_section_for_the_url_gives_nothing(home: Path) -> None:
    """Its [pypi] section is for another index: its token is never sent to this one."""
    _pypirc(home, _SECTION.replace(URL.rstrip("/"), "https://elsewhere.example/"))
    with pytest.raises(PublishError, match="needs credentials"):
        _resolve(home)


def test_a_malformed_pypirc_is_named_never_quoted(home: Path) -> None:
    path = _pypirc(home, f"[internal\nrepository = {URL}\npassword = {SECRET}\n")
    with pytest.raises(PublishError) as caught:
        _resolve(home, ACTIVEKV_INDEX_TOKEN="token")
    message = str(caught.value)
    assert message.startswith(f"{path}: not a .pypirc twine can read (")
    assert SECRET not in message and "\n" not in message


def test_keyring_is_asked_for_the_first_user_named(home: Path) -> None:
    backend = Remembering(URL, "ci-user", "from-keyring")
    keyring.set_keyring(backend)
    found = _resolve(home, TWINE_USERNAME="ci-user")
    assert (found.username, found.password) == ("ci-user", "from-keyring")
    assert found.source == f"keyring for {URL} with the user of TWINE_USERNAME"
    assert backend.asked == [(URL, "ci-user")]


# ------------------------------------------------------------------------------ the precedence


def test_activekv_variables_come_before_twines_and_the_pypirc(home: Path) -> None:
    _pypirc(home, _SECTION)
    twine = {"TWINE_USERNAME": "ci-user", "TWINE_PASSWORD": "twine-pw"}
    ours = _resolve(home, **twine, ACTIVEKV_INDEX_USERNAME="ours", ACTIVEKV_INDEX_PASSWORD="pw")
    assert (ours.username, ours.password) == ("ours", "pw")
    assert ours.source == f"{ENV_PASSWORD} with the user of {ENV_USERNAME}"
    # Our password's user is ours: TWINE_USERNAME does not change it.
    mixed = _resolve(home, **twine, ACTIVEKV_INDEX_PASSWORD="pw")
    assert (mixed.username, mixed.source) == ("bot", f"{ENV_PASSWORD} with the user of "
                                                     "publish.username")  # fmt: skip
    token = _resolve(home, **twine, ACTIVEKV_INDEX_PASSWORD="pw", ACTIVEKV_INDEX_TOKEN="tok")
    assert (token.username, token.password, token.source) == ("__token__", "tok", ENV_TOKEN)
    # A TWINE_REPOSITORY_URL of another index does not matter when ours are used.
    assert _resolve(home, TWINE_REPOSITORY_URL=OTHER, TWINE_PASSWORD="x",
                    ACTIVEKV_INDEX_PASSWORD="pw").password == "pw"  # fmt: skip


def test_twine_variables_come_before_the_pypirc_and_keyring(home: Path) -> None:
    _pypirc(home, _SECTION)
    keyring.set_keyring(Remembering(URL, "bot", "from-keyring"))
    assert _resolve(home, TWINE_PASSWORD="twine-pw").password == "twine-pw"
    assert _resolve(home).password == SECRET  # the pypirc, before keyring
    (home / ".pypirc").unlink()
    assert _resolve(home).password == "from-keyring"


def test_find_credentials_reads_this_processs_environment(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (ENV_TOKEN, ENV_PASSWORD, ENV_USERNAME, "TWINE_PASSWORD", "TWINE_USERNAME",
                 "TWINE_REPOSITORY_URL", "TWINE_CERT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    _pypirc(home, _SECTION)
    assert find_credentials(URL, "bot") == ("pypirc-user", SECRET)
