"""What of a URL may carry a secret, and the URL as a message may show it: userinfo (a password,
or a token as the user), a query or a fragment (where tokens ride) are masked, never printed."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# A URL inside a longer text (an error that quotes a value).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"']*")


def url_secrets(url: str) -> list[str]:
    """The parts of ``url`` that may carry a secret, in words; empty for none (or not a URL)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = ["user information (***@)"] if "@" in parts.netloc else []
    found += ["a query"] if parts.query else []
    found += ["a fragment"] if parts.fragment else []
    return found


def masked_url(url: str) -> str:
    """``url`` with its userinfo, query and fragment masked (``***@host``, ``?***``, ``#***``)."""
    if not url_secrets(url):
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(
        netloc=f"***@{host}" if "@" in parts.netloc else host,
        query="***" if parts.query else "",
        fragment="***" if parts.fragment else "",
    ).geturl()


def mask_urls(text: str) -> str:
    """``text`` with every URL in it masked."""
    return _URL_IN_TEXT.sub(lambda found: masked_url(found.group()), text)
