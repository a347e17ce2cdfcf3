"""The patch promise (docs/security.md): every fix in a distribution's security pocket is in a published digest within
24 hours of the nightly that first sees it. The nightly that sees a fix rebuilds the row's OS security layer and
publishes it in the same run; a row it leaves behind is over the promise once a nightly a day earlier could have
seen the fix, and its summary lists it. Pure functions of the security index's verdicts.
"""
from __future__ import annotations

import datetime as dt

from .freshness import RowSecurity, fix_age

PROMISE = dt.timedelta(hours=24)
PROMISE_TEXT = ("every fix in the distribution's security pocket is in a published digest within 24 hours of the "
                "nightly that first sees it")


def over_promise(behind: dict[str, RowSecurity], published: set[str], today: dt.date) -> list[str]:
    """The rows a nightly leaves lacking a fix (behind: tag -> the verdict that made it due; published: the tags it
    published) whose oldest missing fix is more than a day old: a daily nightly saw it yesterday at the latest, so
    its 24 hours are over. A fix not dated by its changelog (or dated impossibly: freshness.changelog_fixes) cannot
    be aged, and the row is listed as behind, whatever the other fixes' dates."""
    notes = []
    for tag, row in sorted(behind.items()):
        if tag in published:
            continue
        age = fix_age(row.fixable, today)
        undated = not age["oldest_missing_fix"] or any(not item.since for item in row.fixable)
        if undated or age["fix_age_days"] > PROMISE.days:
            dated = "undated" if undated else f"since {age['oldest_missing_fix']} ({age['fix_age_days']} days)"
            notes.append(f"{tag}: over the patch promise ({PROMISE_TEXT}): it still lacks {len(row.fixable)} fixes, "
                         f"the oldest {dated}")
    return notes
