"""Every network read is bounded (release/util/http.py): real servers on 127.0.0.1 that never end
a reply, or drip it a byte at a time, against each reader: the index page, a file's download,
python-tuf's fetcher (through a real Updater), the upload endpoint's probe and note, twine's
upload, and the local server's readiness poll. Each stops at its cap or its deadline in one line
that names the URL and the limit, within seconds and with its memory bounded. The limits come
from the manifest's [publish.limits]; bad values there are refused naming the key."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from bad_servers import dripping, endless, pages, serving
from fixtures_wheels import build_wheel
from test_manifest import REAL, errors_of, load_text

from release.errors import PackageIndexError, PublishError, VerifyError
from release.manifest import NetworkLimits
from release.trust.index import list_project_files, project_files
from release.trust.remote_index import RemoteIndex, check_credentials
from release.trust.served_files import check_served_files
from release.trust.server_process import answers
from release.trust.tuf_client import BoundedFetcher, LimitError, TrustedIndex
from release.trust.tuf_metadata import TufRepository
from release.trust.twine_upload import upload

CAP = 1 << 20  # 1 MiB: the endless servers send 256 MiB
SMALL = NetworkLimits(page_bytes=CAP, file_bytes=CAP, deadline_s=1)
WHEEL = "activekv-0.1.0-py3-none-any.whl"


def _bounded(call: Callable[[], object], error: type[Exception]) -> tuple[str, float, int]:
    """The one-line message ``call`` fails with, the seconds it took and its peak memory."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(error) as caught:
            call()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    message = str(caught.value)
    assert "\n" not in message, message
    return message, time.monotonic() - start, peak


def _too_large(url: str, key: str) -> str:
    return f"{url}: the reply exceeded 1 MiB (publish.limits.{key} = {CAP}); stopped reading"


def _too_slow(url: str) -> str:
    return f"{url}: no complete reply within 1 s (publish.limits.deadline_s = 1); stopped reading"


# ------------------------------------------------------------------------------ index pages


def test_an_index_page_that_never_ends_stops_at_the_page_cap() -> None:
    with serving(endless()) as base:
        message, _, peak = _bounded(
            lambda: project_files(base + "/simple/", "activekv", limits=SMALL), PackageIndexError
        )
    assert message == _too_large(f"{base}/simple/activekv/", "page_bytes")
    assert peak < 8 * CAP  # read in chunks up to the cap, never whole


def test_an_index_page_that_drips_stops_at_the_deadline() -> None:
    with serving(dripping()) as base:
        message, seconds, _ = _bounded(
            lambda: list_project_files(base + "/simple/", "activekv", limits=SMALL),
            PackageIndexError,
        )
    assert message == _too_slow(f"{base}/simple/activekv/")
    assert seconds < 4  # each byte comes within urllib's per-read timeout: only a deadline ends it


def test_headers_that_drip_stop_at_the_deadline() -> None:
    with serving(dripping(headers=True)) as base:
        message, seconds, _ = _bounded(
            lambda: project_files(base + "/simple/", "activekv", limits=SMALL), PackageIndexError
        )
    assert message == _too_slow(f"{base}/simple/activekv/")
    assert seconds < 4


def test_a_declared_length_past_the_cap_is_refused_before_reading() -> None:
    body = b"<a href='x'>x</a>" * (CAP // 10)
    with serving(pages({"/simple/activekv/": (b"text/html", body)})) as base:
        message, _, _ = _bounded(
            lambda: project_files(base + "/simple/", "activekv", limits=SMALL), PackageIndexError
        )
    assert message == _too_large(f"{base}/simple/activekv/", "page_bytes")


def test_the_default_limits_read_a_real_page(tmp_path: Path) -> None:
    body = f'<a href="/packages/{WHEEL}#sha256={"ab" * 32}">{WHEEL}</a>'.encode()
    with serving(pages({"/simple/activekv/": (b"text/html", body)})) as base:
        assert list_project_files(base + "/simple/", "activekv") == {WHEEL: "ab" * 32}


# ------------------------------------------------------------------------------ downloads


def _listing(base: str) -> bytes:
    return f'<a href="{base}/packages/{WHEEL}">{WHEEL}</a>'.encode()


@pytest.mark.parametrize("kind", ["endless", "dripping"])
def test_a_served_file_past_a_limit_fails_the_verify_naming_url_and_limit(
    tmp_path: Path, kind: str
) -> None:
    routes: dict[str, tuple[bytes, bytes]] = {}
    listing = pages(routes)
    misbehaving = endless(b"application/octet-stream") if kind == "endless" else dripping()

    def handle(connection: object, request: bytes) -> None:
        on_page = request.split(b" ", 2)[1].startswith(b"/simple/")
        (listing if on_page else misbehaving)(connection, request)  # type: ignore[arg-type]

    with serving(handle) as base:
        routes["/simple/activekv/"] = (b"text/html", _listing(base))
        message, seconds, peak = _bounded(
            lambda: check_served_files(
                simple_url=base + "/simple/",
                project="activekv",
                version="0.1.0",
                signed={WHEEL: "00" * 32},
                folder=tmp_path / "served",
                limits=SMALL,
            ),
            VerifyError,
        )
    url = f"{base}/packages/{WHEEL}"
    assert message == (_too_large(url, "file_bytes") if kind == "endless" else _too_slow(url))
    assert seconds < 4 and peak < 8 * CAP


# ------------------------------------------------------------------------------ TUF


@pytest.fixture(scope="module")
def trusted_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = TufRepository(tmp_path_factory.mktemp("tuf"))
    repository.add_targets({})
    return repository.trusted_root_path


@pytest.mark.parametrize("kind", ["endless", "dripping"])
def test_tuf_metadata_past_a_limit_fails_the_refresh_naming_url_and_limit(
    tmp_path: Path, trusted_root: Path, kind: str
) -> None:
    handler = endless(b"application/json") if kind == "endless" else dripping(b"application/json")
    limits = NetworkLimits(page_bytes=CAP, deadline_s=1)
    with serving(handler) as base:
        trusted = TrustedIndex(base + "/tuf/", trusted_root, tmp_path / "cache", limits=limits)
        message, seconds, peak = _bounded(trusted.refresh, VerifyError)
    url = f"{base}/tuf/metadata/2.root.json"  # the Updater first asks for the next root
    # python-tuf's own cap on a root (512000 bytes) is smaller than 1 MiB: it stops first.
    if kind == "endless":
        assert "DownloadLengthMismatchError" in message and base in message
    else:
        assert message == _too_slow(url)
    assert seconds < 4 and peak < 8 * CAP


def test_the_tuf_fetcher_caps_metadata_and_targets_apart() -> None:
    limits = NetworkLimits(page_bytes=CAP, file_bytes=2 * CAP, deadline_s=5)
    with serving(endless(b"application/json")) as base:
        fetcher = BoundedFetcher(base + "/tuf/metadata/", limits)
        for path, key, cap in (("metadata/timestamp.json", "page_bytes", CAP),
                               ("targets/x.whl", "file_bytes", 2 * CAP)):  # fmt: skip
            url = f"{base}/tuf/{path}"
            with pytest.raises(LimitError) as caught:
                fetcher.download_bytes(url, 1 << 40)  # python-tuf's length: none to speak of
            assert str(caught.value) == (
                f"{url}: the reply exceeded {cap >> 20} MiB (publish.limits.{key} = {cap}); "
                "stopped reading"
            )


def test_a_missing_next_root_is_still_a_404_to_python_tuf(tmp_path: Path) -> None:
    """The fetcher keeps python-tuf's contract: its HTTP errors carry the status code."""
    repository = TufRepository(tmp_path / "tuf")
    repository.add_targets({})
    metadata = repository.metadata_dir
    routes = {f"/tuf/metadata/{p.name}": (b"application/json", p.read_bytes())
              for p in metadata.iterdir()}  # fmt: skip
    with serving(pages(routes)) as base:
        trusted = TrustedIndex(base + "/tuf/", repository.trusted_root_path, tmp_path / "cache",
                               limits=SMALL)  # fmt: skip
        trusted.refresh()  # 2.root.json is a 404: root 1 is the newest


# ------------------------------------------------------------------------------ upload endpoint


def test_an_upload_endpoint_that_drips_fails_the_credential_check_at_the_deadline() -> None:
    with serving(dripping(headers=True)) as base:
        message, seconds, _ = _bounded(
            lambda: check_credentials(base + "/", "bot", "pw", limits=SMALL), PublishError
        )
    assert message == _too_slow(base + "/")
    assert seconds < 4


def test_an_endless_reply_to_the_overwrite_question_is_named_in_the_note(tmp_path: Path) -> None:
    with serving(endless(b"application/json")) as base:
        index = RemoteIndex(base + "/simple/", base + "/", tmp_path, base + "/tuf/",
                            tmp_path / "keys", "bot", limits=SMALL)  # fmt: skip
        note = index.overwrite_note()
    assert note is not None and _too_large(base + "/", "page_bytes") in note


def test_a_twine_upload_to_an_endpoint_that_drips_ends_at_the_deadline(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    with serving(dripping(headers=True)) as base:
        message, seconds, _ = _bounded(
            lambda: upload(wheel, base + "/", "bot", "pw", limits=NetworkLimits(deadline_s=3)),
            PublishError,
        )
    assert message == (f"twine upload of {wheel.name} to {base}/ did not finish in 3 s "
                       "(publish.limits.deadline_s = 3)")  # fmt: skip
    assert seconds < 8


def test_a_twine_upload_whose_reply_never_ends_stops_at_the_page_cap(tmp_path: Path) -> None:
    """twine reads a reply whole: in this process it is read in chunks up to the cap, never
    whole, and never more than the cap is kept."""
    wheel = build_wheel(tmp_path / "dist")
    with serving(endless()) as base:
        message, seconds, peak = _bounded(
            lambda: upload(wheel, base + "/", "bot", "pw", limits=SMALL), PublishError
        )
    assert message == _too_large(base + "/", "page_bytes")
    assert seconds < 4 and peak < 8 * CAP


def test_a_local_server_that_drips_its_headers_is_not_ready_within_a_second() -> None:
    with serving(dripping(headers=True)) as base:
        start = time.monotonic()
        assert not answers(base + "/simple/")
        assert time.monotonic() - start < 3


# ------------------------------------------------------------------------------ the manifest


def _with_limits(body: str) -> str:
    return REAL.read_text(encoding="utf-8") + f"\n[publish.limits]\n{body}\n"


def test_the_manifest_limits_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_text(tmp_path, monkeypatch, REAL.read_text()).publish.limits == NetworkLimits()
    text = _with_limits("page_bytes = 1048576\nfile_bytes = 2147483648\ndeadline_s = 12.5")
    limits = load_text(tmp_path, monkeypatch, text).publish.limits
    assert limits == NetworkLimits(page_bytes=1 << 20, file_bytes=2 << 30, deadline_s=12.5)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("page_bytes = 0", "publish.limits.page_bytes"),
        ('page_bytes = "64 MiB"', "publish.limits.page_bytes"),
        ("file_bytes = -1", "publish.limits.file_bytes"),
        ("file_bytes = 1.5", "publish.limits.file_bytes"),
        ("deadline_s = 0", "publish.limits.deadline_s"),
        ("deadline_s = 1e9", "publish.limits.deadline_s"),
        ("deadline_s = true", "publish.limits.deadline_s"),
        ("timeout = 3", "publish.limits.timeout"),
    ],
)
def test_bad_manifest_limits_are_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, key: str
) -> None:
    lines = errors_of(tmp_path, monkeypatch, _with_limits(line))
    assert len(lines) == 1 and lines[0].startswith(f"bad.toml: {key}: "), lines
