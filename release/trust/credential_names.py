"""The environment variables an index's credentials come in (README, "Credentials"): named apart
from the client that reads them, so the workflow's generator and its replay on a GPU runner
import no HTTP stack."""

from __future__ import annotations

ENV_USERNAME = "ACTIVEKV_INDEX_USERNAME"
ENV_PASSWORD = "ACTIVEKV_INDEX_PASSWORD"
ENV_TOKEN = "ACTIVEKV_INDEX_TOKEN"
