"""A keyring backend is anyone's code: whatever it raises, finding credentials fails in one line
that names the backend, the upload URL and the exception's type (never its text, which may quote
a secret) and says how to give credentials otherwise. Real backends, set with
keyring.set_keyring."""

from __future__ import annotations

from collections.abc import Iterator

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail, null

from release.errors import PublishError
from release.trust.remote_index import ENV_PASSWORD, ENV_TOKEN, ENV_USERNAME, find_credentials

URL = "https://index.example/upload/"
SECRET = "hunter2-in-the-message"


class Broken(KeyringBackend):
    """A backend whose lookup raises what no keyring error is, quoting a secret."""

    priority = 1  # type: ignore[assignment]
    raised: type[Exception] = RuntimeError

    def get_password(self, service: str, username: str) -> str | None:
        raise self.raised(f"backend state: password={SECRET}")

    def set_password(self, service: str, username: str, password: str) -> None:
        raise NotImplementedError

    def delete_password(self, service: str, username: str) -> None:
        raise NotImplementedError


class Locked(Broken):
    raised = keyring.errors.KeyringLocked


class NotAString(Broken):
    def get_password(self, service: str, username: str) -> str | None:
        return b"bytes"  # type: ignore[return-value]


@pytest.fixture(autouse=True)
def _no_credentials_in_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (ENV_TOKEN, ENV_PASSWORD, ENV_USERNAME):
        monkeypatch.delenv(name, raising=False)
    before = keyring.get_keyring()
    yield
    keyring.set_keyring(before)


@pytest.mark.parametrize("backend", [Broken, Locked])
def test_a_backend_that_raises_is_one_line_naming_backend_url_and_type(
    backend: type[Broken],
) -> None:
    keyring.set_keyring(backend())
    with pytest.raises(PublishError) as caught:
        find_credentials(URL, "bot")
    message = str(caught.value)
    assert "\n" not in message and SECRET not in message
    assert message.startswith(
        f"keyring backend {backend.__module__}.{backend.__qualname__} failed "
        f"({backend.raised.__name__}) reading the password of user 'bot' for {URL}; set "
        f"{ENV_PASSWORD}"
    ), message
    assert ENV_TOKEN in message and "PYTHON_KEYRING_BACKEND" in message


@pytest.mark.parametrize("backend", [fail.Keyring, null.Keyring, NotAString])
def test_a_backend_with_no_password_asks_for_credentials(backend: type[KeyringBackend]) -> None:
    keyring.set_keyring(backend())
    with pytest.raises(PublishError, match=rf"^publishing to {URL} needs credentials: set "):
        find_credentials(URL, "bot")


def test_the_environment_is_asked_before_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    keyring.set_keyring(Broken())
    monkeypatch.setenv(ENV_PASSWORD, "from-env")
    assert find_credentials(URL, "bot") == ("bot", "from-env")
