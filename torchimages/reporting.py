"""Small pieces every report shares: UTC timestamps and Markdown table cells."""
from __future__ import annotations

from datetime import datetime, timezone


def utc_timestamp(moment: datetime | None = None) -> str:
    """2026-11-21T20:42:56Z: the one timestamp format of reports, labels and the catalog."""
    return (moment or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def markdown_cell(text) -> str:
    """Text on one line, with pipes escaped, so it cannot break a Markdown table."""
    return " ".join(str(text).split()).replace("|", "\\|")
