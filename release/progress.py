"""The one rich console every step prints through (progress, tables, errors)."""

from rich.console import Console

console = Console(highlight=False, soft_wrap=True)
error_console = Console(stderr=True, highlight=False, soft_wrap=True)
