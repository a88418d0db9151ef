"""What a refused upload reports: the index's status and its own words, on one line, from the
reply twine 7.0.0 got in this process (release/trust/twine_upload.py). A real stdlib server on
127.0.0.1 answers, twine uploads a real wheel; no log is parsed."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_wheels import build_wheel
from test_conventions_twine import Recorder, recording

from release.errors import PublishError
from release.trust.twine_upload import server_text, upload

USER, PASSWORD = "bot", "pw"

# pypiserver's error page (bottle), as it answers a full disk.
_PYPISERVER_507 = b"""\
<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">
<html>
    <head>
        <title>Error: 507 Insufficient Storage</title>
        <style type="text/css">
          pre {background-color: #eee; border: 1px solid #ddd; padding: 5px;}
        </style>
    </head>
    <body>
        <h1>Error: 507 Insufficient Storage</h1>
        <pre>cannot store x.whl in the index&#039;s package folder: No space left
        on device (ENOSPC); nothing was kept</pre>
    </body>
</html>
"""


def _refusal(wheel: Path, recorder: Recorder) -> tuple[str, str]:
    """The one line a refused upload fails with, and the URL it went to."""
    with recording(recorder) as url, pytest.raises(PublishError) as caught:
        upload(wheel, url, USER, PASSWORD)
    message = str(caught.value)
    assert "\n" not in message, message
    return message, url


def test_an_error_page_is_reduced_to_what_the_server_said(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    message, url = _refusal(wheel, Recorder(status=507, body=_PYPISERVER_507))
    assert message == (
        f"twine upload of {wheel.name} to {url} failed: the index answered 507 Insufficient "
        "Storage: cannot store x.whl in the index's package folder: No space left on device "
        "(ENOSPC); nothing was kept"
    )


def test_the_last_response_is_the_one_reported(tmp_path: Path) -> None:
    """twine retries a 5xx: what the index said last is reported, not its first answer."""
    recorder = Recorder(status=507, body=_PYPISERVER_507, earlier=[(500, b"<pre>Oops</pre>")])
    message, _ = _refusal(build_wheel(tmp_path), recorder)
    assert "the index answered 507 Insufficient Storage: cannot store" in message
    assert "Oops" not in message and "500" not in message
    assert len(recorder.requests) == 5  # twine's own retries


def test_a_response_without_a_body_reports_its_status(tmp_path: Path) -> None:
    message, _ = _refusal(build_wheel(tmp_path), Recorder(status=403))
    assert message.endswith(" failed: the index answered 403 Forbidden")


def test_a_plain_text_or_json_answer_is_kept_as_one_line(tmp_path: Path) -> None:
    body = b'{"message": "activekv-0.1.0.whl already exists in\n  non-volatile index"}'
    message, _ = _refusal(build_wheel(tmp_path), Recorder(status=409, body=body))
    assert message.endswith(
        ' failed: the index answered 409 Conflict: {"message": "activekv-0.1.0.whl already '
        'exists in non-volatile index"}'
    )


def test_without_a_response_the_cause_is_reported_in_its_own_words(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with recording(Recorder()) as url:
        pass  # stopped: its port now refuses connections
    with pytest.raises(PublishError) as caught:
        upload(wheel, url, USER, PASSWORD)
    assert str(caught.value) == f"twine upload of {wheel.name} to {url} failed: Connection refused"
    # A file twine cannot read is twine's own error, before anything is sent.
    broken = tmp_path / "broken" / wheel.name
    broken.parent.mkdir()
    broken.write_bytes(b"not a zip")
    recorder = Recorder()
    with recording(recorder) as url, pytest.raises(PublishError) as caught:
        upload(broken, url, USER, PASSWORD)
    assert str(caught.value).startswith(
        f"twine upload of {broken.name} to {url}: twine cannot read the file ("
    )
    assert "\n" not in str(caught.value) and recorder.requests == []


def test_markup_is_dropped_and_long_answers_are_cut() -> None:
    assert server_text("<html><title>t</title><body><h1>Bad</h1> <p>name&amp;</p></body>") == (
        "Bad name&"
    )
    assert len(server_text("x" * 5000)) == 400
