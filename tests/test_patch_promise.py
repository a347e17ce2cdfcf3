"""The patch promise, measured (issue 48, docs/security.md): every fix in the distribution's security pocket is in a
published digest within 24 hours of the nightly that first sees it. A recorded sequence of security-index snapshots
(signed, dated, each fix with its changelog) is replayed with a frozen clock through the nightly's decision
(Nightly.security_due against the catalog's SBOM), a nightly that rebuilds a row taking every fix its pocket has
(the OS security layer's `apt-get upgrade`); a ledger records when each fix was first seen and first published.
No engine: the decision is the catalog's SBOM against the index, and publishing a rebuild is its SBOM moving on."""
import datetime as dt
import json
from dataclasses import dataclass, field

import pytest

from torchimages.nightly.summary import Published
from torchimages.security import freshness as security
from torchimages.security import promise

from .conftest import run_cli_in_process
from .security_fixtures import SUITE, Package, clearsign, make_key, nightly_for, published_project, write_archive

TAG = "2.13.0-cpu-runtime"
INSTALLED = {"libssl3": ("3.0.19-1~deb12u1", "amd64"), "tzdata": ("2025b-0+deb12u1", "all"),
             "base-files": ("12.4+deb12u5", "amd64")}
RUN = dt.timedelta(hours=1)  # how long a nightly takes from its decision to its publish


def changelog(source: str, version: str, cve: str, released: str) -> str:
    return (f"{source} ({version}) bookworm-security; urgency=high\n\n  * Fix {cve}.\n\n"
            f" -- Debian Security Team <team@security.debian.org>  {released}\n")


OPENSSL = Package("libssl3", "3.0.22-1~deb12u2", changelog=changelog(
    "openssl", "3.0.22-1~deb12u2", "CVE-2026-90001", "Fri, 20 Nov 2026 10:00:00 +0000"))
TZDATA = Package("tzdata", "2026a-0+deb12u1", arch="all", changelog=changelog(
    "tzdata", "2026a-0+deb12u1", "CVE-2026-90002", "Sat, 21 Nov 2026 15:00:00 +0000"))
OPENSSL_AGAIN = Package("libssl3", "3.0.23-1~deb12u1", changelog=changelog(
    "openssl", "3.0.23-1~deb12u1", "CVE-2026-90003", "Mon, 23 Nov 2026 09:00:00 +0000"))


def night(day: int) -> dt.datetime:
    return dt.datetime(2026, 11, day, 2, 0, tzinfo=dt.timezone.utc)


# The recorded snapshots: when a nightly ran, and what the security pocket held then.
SNAPSHOTS = [(night(20), []), (night(21), [OPENSSL]), (night(22), [OPENSSL, TZDATA]), (night(23), [OPENSSL, TZDATA]),
             (night(24), [OPENSSL_AGAIN, TZDATA]), (night(25), [OPENSSL_AGAIN, TZDATA])]


@dataclass
class Ledger:
    """When each fix (package, fixed version) was first seen by a nightly, and first carried by a published digest."""

    seen: dict[tuple[str, str], dt.datetime] = field(default_factory=dict)
    shipped: dict[tuple[str, str], dt.datetime] = field(default_factory=dict)

    def saw(self, row: security.RowSecurity, when: dt.datetime) -> None:
        for item in row.fixable:
            self.seen.setdefault((item.package, item.fixed), when)

    def published(self, installed: dict[str, tuple[str, str]], when: dt.datetime) -> None:
        for package, fixed in self.seen:
            if installed[package][0] == fixed:
                self.shipped.setdefault((package, fixed), when)

    def late(self, now: dt.datetime) -> list[str]:
        """The fixes not published within the promise of the nightly that first saw them (as of now)."""
        return [f"{package} {fixed}" for (package, fixed), seen in sorted(self.seen.items())
                if self.shipped.get((package, fixed), now) - seen > promise.PROMISE]


def snapshot(root, key, packages: list[Package], dated: dt.datetime):
    """The archive as it was at `dated`: its Release file signed with that Date, as Debian's carries one."""
    write_archive(root, key, packages)
    release = root / "dists" / SUITE / "InRelease"
    body = release.read_text().split("\n\n", 1)[1].split("\n-----BEGIN PGP SIGNATURE", 1)[0]
    release.write_bytes(clearsign(key, f"Date: {dated:%a, %d %b %Y %H:%M:%S} UTC\n" + body + "\n"))
    return root


def replay(tmp_path, monkeypatch, failing_nights=()) -> tuple[Ledger, dict[dt.datetime, list[str]]]:
    """Each snapshot through the nightly's decision at its own frozen time; a row it finds due is rebuilt with every
    fix of its pocket and published an hour later, unless that night's publish fails. Returns the ledger and each
    night's promise notes."""
    key = make_key(tmp_path, "archive")
    installed = dict(INSTALLED)
    ledger, notes = Ledger(), {}
    for number, (when, packages) in enumerate(SNAPSHOTS):
        monkeypatch.setattr(security, "utc_now", lambda when=when: when)
        root = snapshot(tmp_path / f"archive{number}", key, packages, when - dt.timedelta(hours=4))
        run, specs, catalog = nightly_for(tmp_path / f"night{number}", str(root), str(key.keyring),
                                          [(name, version, arch) for name, (version, arch) in installed.items()])
        due = run.security_due(specs, catalog)
        if TAG in due:
            ledger.saw(run.behind[TAG], when)
            if when not in failing_nights:
                installed.update({item.package: (item.fixed, item.arch) for item in run.behind[TAG].fixable})
                ledger.published(installed, when + RUN)
                run.summary.published.append(Published(TAG, f"{TAG}-{when:%Y%m%d}", "sha256:" + "e" * 64))
        notes[when] = run.over_promise(when.date())
    return ledger, notes


def test_replayed_snapshots_meet_the_patch_promise(tmp_path, monkeypatch):
    ledger, notes = replay(tmp_path, monkeypatch)
    assert sorted(ledger.seen) == [("libssl3", "3.0.22-1~deb12u2"), ("libssl3", "3.0.23-1~deb12u1"),
                                   ("tzdata", "2026a-0+deb12u1")]
    assert ledger.seen[("libssl3", "3.0.22-1~deb12u2")] == night(21)  # the first nightly after its release
    assert ledger.late(night(25) + promise.PROMISE) == []
    assert all(shipped - ledger.seen[fix] <= promise.PROMISE for fix, shipped in ledger.shipped.items())
    assert not any(notes.values())


def test_a_nightly_that_fails_to_publish_two_nights_running_breaks_the_promise_and_says_so(tmp_path, monkeypatch):
    ledger, notes = replay(tmp_path, monkeypatch, failing_nights=(night(21), night(22)))
    # The fix the failed nights first saw, and the one the second failed night first saw, both shipped late.
    assert ledger.late(night(25)) == ["libssl3 3.0.22-1~deb12u2", "tzdata 2026a-0+deb12u1"]
    assert notes[night(21)] == []  # a day-old fix: the next nightly still keeps the promise
    [over] = notes[night(22)]
    assert over.startswith(f"{TAG}: over the patch promise") and "since 2026-11-20 (2 days)" in over


def test_a_snapshot_dated_in_the_future_is_refused_with_exit_2_in_one_line(tmp_path, monkeypatch):
    key = make_key(tmp_path, "archive")
    now = night(21)
    monkeypatch.setattr(security, "utc_now", lambda: now)
    root = snapshot(tmp_path / "archive", key, [OPENSSL], now + dt.timedelta(days=2))
    args = published_project(tmp_path / "project", str(root), str(key.keyring),
                             [(name, version, arch) for name, (version, arch) in INSTALLED.items()])
    refused = run_cli_in_process(*args)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert len(lines) == 1 and "the Release file is dated 2026-11-23 02:00 UTC, after this host's clock" in lines[0]
    # Within the allowed skew, it is read.
    snapshot(root, key, [OPENSSL], now + dt.timedelta(minutes=30))
    assert run_cli_in_process(*args).returncode == 1  # the fix it lacks, found


@pytest.mark.parametrize(("fixed_on", "today", "over"), [
    ("2026-11-20", dt.date(2026, 11, 21), False), ("2026-11-20", dt.date(2026, 11, 22), True), ("", night(21).date(), True)])
def test_a_row_left_behind_is_over_the_promise_once_its_fix_is_more_than_a_day_old(fixed_on, today, over):
    row = security.RowSecurity(TAG, "debian12", "bookworm-security index", "verified",
                               [security.Fixable("libssl3", "amd64", "1", "2", ("CVE-2026-90001",), fixed_on)])
    assert bool(promise.over_promise({TAG: row}, set(), today)) is over
    assert promise.over_promise({TAG: row}, {TAG}, today) == []  # published this run: kept


def test_the_security_command_reports_each_rows_fix_age(tmp_path, monkeypatch):
    key = make_key(tmp_path, "archive")
    monkeypatch.setattr(security, "utc_now", lambda: night(22))
    root = snapshot(tmp_path / "archive", key, [OPENSSL, TZDATA], night(22) - dt.timedelta(hours=4))
    args = published_project(tmp_path / "project", str(root), str(key.keyring),
                             [(name, version, arch) for name, (version, arch) in INSTALLED.items()])
    [row] = json.loads(run_cli_in_process(*args, "--format", "json", check_exit=1).stdout)["rows"]
    assert row["fixable_count"] == 2 and row["oldest_missing_fix"] == "2026-11-20"
    assert row["fix_age_days"] == 2  # by the frozen clock
    shown = run_cli_in_process(*args, check_exit=1).stdout
    assert "the oldest fix it lacks is from 2026-11-20, 2 days ago" in shown
