"""``[publish.limits]``, the bounds on every network read (release/util/http.py): the model
lives here, below the manifest that holds it, so the HTTP helpers need no manifest."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt


class NetworkLimits(BaseModel):
    """``[publish.limits]``: bounds on every read from an index, a TUF server or an upload
    endpoint (release/util/http.py); past either, one line names the URL and the limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # An index page (PEP 503 HTML or PEP 691 JSON), a TUF metadata file or a server's reply.
    # PyPI's largest project pages are a few MB.
    page_bytes: Annotated[StrictInt, Field(gt=0, le=1 << 34)] = 64 << 20
    # One downloaded file: a wheel, an sdist, a provenance envelope.
    file_bytes: Annotated[StrictInt, Field(gt=0, le=1 << 40)] = 4 << 30
    # One request, from the connection to its last byte (a reply that drips never ends it).
    deadline_s: Annotated[StrictFloat, Field(gt=0, le=86_400)] = 300.0
