"""The one rich console every step prints through (progress, tables, errors)."""

import sys

from rich.console import Console

# Logs and CI are not terminals: give tables room for wheel names and digests there.
_WIDTH = None if sys.stdout.isatty() else 180

console = Console(highlight=False, soft_wrap=True, width=_WIDTH)
error_console = Console(stderr=True, highlight=False, soft_wrap=True, width=_WIDTH)
