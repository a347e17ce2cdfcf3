"""The security archive's reader, tried as an attacker would (issue 45's fifth hostile-input round; docs/hostile-input.md,
"The new code"): debs the signed index does not vouch for, ar members, FIFOs and links in a saved index, Release
entries, dpkg versions, inert index text and vouched sizes.

The archives are saved indexes in folders or served from 127.0.0.1 (tests/security_fixtures.py); nothing here needs
an engine or leaves this machine. A test that could hang on today's code runs under an alarm, so it fails instead.
"""
from __future__ import annotations

import datetime as dt
import os

import pytest

from torchimages.security import freshness as security
from torchimages.security import gate as security_gate

from .hostile_fixtures import within
from .security_fixtures import (
    INSTALLED,
    SUITE,
    Package,
    ar,
    check,
    make_deb,
    make_key,
    pool_path,
    published_project,
    serve,
    write_archive,
)

ESCAPE = "\x1b]0;owned\x07\x1b[2J"


@pytest.fixture(scope="module")
def archive_key(tmp_path_factory):
    return make_key(tmp_path_factory.mktemp("keys"), "archive")

OPENSSL = Package("libssl3", "3.0.22-1~deb12u2", changelog="""openssl (3.0.22-1~deb12u2) bookworm-security; urgency=medium

  * Fix CVE-2026-28387.

 -- Debian Security Team <team@security.debian.org>  Fri, 03 Apr 2026 10:00:00 +0000
""")
SWAPPED_CHANGELOG = OPENSSL.changelog.replace("CVE-2026-28387", "CVE-2020-0001")  # an allowlisted, unrelated CVE


def test_a_deb_the_signed_index_does_not_vouch_for_is_not_read(tmp_path, archive_key):
    root = write_archive(tmp_path / "mirror", archive_key, [OPENSSL])
    (root / pool_path(OPENSSL)).write_bytes(make_deb("libssl3", SWAPPED_CHANGELOG))  # a plain-http mirror's swap
    logged: list[str] = []
    with serve(root) as url:
        row = security.Checker(_compat(url, archive_key), "compat.yaml", log=logged.append).check(
            "row", "debian12", INSTALLED)
    assert [item.cves for item in row.fixable] == [()], "a changelog the index does not vouch for was read"
    assert any("truncated or replaced" in line for line in logged), logged
    judged = security_gate.judge([row], _allowing("CVE-2020-0001"), dt.date(2026, 11, 25))
    assert judged.status == "failed"


def test_a_vouched_deb_still_names_its_cves(tmp_path, archive_key):
    row = check(str(write_archive(tmp_path / "mirror", archive_key, [OPENSSL])), str(archive_key.keyring))
    assert [item.cves for item in row.fixable] == [("CVE-2026-28387",)], row.error


@pytest.mark.parametrize("size", [b"-60", b"-1", b"99999999", b"0x10", b" 1 2"])
def test_ar_member_sizes_that_are_negative_or_past_the_end_are_refused_without_a_spin(size):
    deb = bytearray(ar({"debian-binary": b"2.0\n", "data.tar.xz": b"x" * 40}))
    deb[8 + 48:8 + 58] = size.ljust(10)
    with within(5):
        assert security.deb_changelog(bytes(deb), "libssl3") is None


def test_a_fifo_in_a_saved_index_is_refused_without_waiting(tmp_path, archive_key):
    root = write_archive(tmp_path / "mirror", archive_key, [OPENSSL])
    release = root / "dists" / SUITE / "InRelease"
    release.unlink()
    os.mkfifo(release)
    with within(10):
        row = check(str(root), str(archive_key.keyring))
    assert "not a regular file" in row.error and str(release) in row.error


def test_a_link_to_dev_zero_in_a_saved_index_is_refused(tmp_path, archive_key):
    root = write_archive(tmp_path / "mirror", archive_key, [OPENSSL])
    index = root / "dists" / SUITE / "main" / "binary-amd64" / "Packages.xz"
    index.unlink()
    index.symlink_to("/dev/zero")
    with within(10):
        row = check(str(root), str(archive_key.keyring))
    assert "not a regular file" in row.error or "truncated or replaced" in row.error, row.error


@pytest.mark.parametrize(("entry", "said"), [
    (" {digest} -5 main/binary-amd64/Packages.xz", "not `HASH SIZE PATH`"),  # read /dev/zero until memory ran out
    (" {digest} main/binary-amd64/Packages.xz", "not `HASH SIZE PATH`"),  # a KeyError
    (" {digest} 1e3 main/binary-amd64/Packages.xz", "not `HASH SIZE PATH`"),  # a ValueError
    (" nothex 12 main/binary-amd64/Packages.xz", "not `HASH SIZE PATH`"),
])
def test_release_entries_not_of_their_shape_are_one_line(tmp_path, entry, said):
    root = write_archive(tmp_path / "mirror", None, [OPENSSL])
    release = root / "dists" / SUITE / "InRelease"
    digest = "a" * 64
    release.write_text(f"Origin: Debian\nSHA256:\n{entry.format(digest=digest)}\n")
    with within(10):
        row = check(str(root))
    assert said in row.error and str(release) in row.error, row.error


def test_a_valid_until_that_is_not_a_date_is_refused(tmp_path):
    root = write_archive(tmp_path / "mirror", None, [OPENSSL])
    release = root / "dists" / SUITE / "InRelease"
    release.write_text(release.read_text().replace("Origin: Debian\n", "Origin: Debian\nValid-Until: Sat, 01 Jan 99999\n"))
    assert "Valid-Until 'Sat, 01 Jan 99999' is not a date" in check(str(root)).error


@pytest.mark.parametrize("version", ["abc", "1.0 2", "1:", "3.0-", "1" * 5000, "9" * 300])
def test_versions_dpkg_refuses_in_the_index_are_one_line_naming_it(tmp_path, version):
    root = write_archive(tmp_path / "mirror", None, [Package("libssl3", version)])
    row = check(str(root))
    assert "not of its shape" in row.error and "Packages.xz" in row.error, row.error
    assert len(row.error) < 400


def test_versions_dpkg_refuses_in_a_changelog_are_passed_over():
    text = OPENSSL.changelog.replace("3.0.22-1~deb12u2", "x" * 20 + "!") + "\n" + OPENSSL.changelog
    assert security.changelog_fixes(text, "3.0.19-1~deb12u1") == (("CVE-2026-28387",), "2026-04-03")


def test_an_sbom_version_dpkg_refuses_is_exit_2_naming_the_sbom(tmp_path, archive_key):
    args = published_project(tmp_path, "http://unused.invalid", str(archive_key.keyring),
                             [("libssl3", "1" * 5000, "amd64")])
    from .conftest import run_cli_in_process
    refused = run_cli_in_process(*args)
    assert refused.returncode == 2 and "which dpkg refuses" in refused.stderr and ".cdx.json" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_an_image_listing_a_version_dpkg_refuses_is_a_row_error_not_a_traceback(tmp_path, archive_key):
    root = write_archive(tmp_path / "mirror", archive_key, [OPENSSL])
    row = check(str(root), str(archive_key.keyring), installed=[security.Installed("libssl3", "0:", "amd64")])
    assert "which dpkg refuses" in row.error and not row.fixable


def test_index_text_is_inert_in_messages(tmp_path):
    root = write_archive(tmp_path / "mirror", None, [Package("libssl3", "1.0" + ESCAPE)])
    row = check(str(root))
    assert row.error and "\x1b" not in row.error and "\x07" not in row.error


def test_a_huge_vouched_index_size_is_refused_before_fetching(tmp_path):
    root = write_archive(tmp_path / "mirror", None, [OPENSSL])
    release = root / "dists" / SUITE / "InRelease"
    text = release.read_text()
    served = (root / "dists" / SUITE / "main" / "binary-amd64" / "Packages.xz").read_bytes()
    release.write_text(text.replace(f" {len(served)} main/binary-amd64", f" {1 << 40} main/binary-amd64"))
    assert "larger than" in check(str(root)).error


def _compat(url: str, key) -> dict:
    from .security_fixtures import compat_for
    return compat_for(url, str(key.keyring))


def _allowing(*ids: str):
    from torchimages.security.sbom import AllowedVulnerability, Allowlist
    return Allowlist(tuple(AllowedVulnerability(key, "not reachable", dt.date(2027, 1, 1)) for key in ids), path="allow.yaml")
