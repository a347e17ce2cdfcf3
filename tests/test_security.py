"""Security freshness: fixable OS updates from the distribution's security index (served from 127.0.0.1), the CVEs
their changelogs name, the gate's verdict, the `security` command, and the damaged or hostile indexes it refuses."""
import datetime as dt
import json
import lzma
import os
import shutil

import pytest

from torchimages.model import InputError
from torchimages.security import freshness as security
from torchimages.security import gate as security_gate
from torchimages.security.sbom import AllowedVulnerability, Allowlist, Inventory, ScanResult, cyclonedx, load_allowlist

from .conftest import copy_fixture_project, run_cli_in_process
from .security_fixtures import (
    INSTALLED,
    OPENSSL_CHANGELOG,
    SUITE,
    Package,
    check,
    compat_for,
    make_key,
    nightly_for,
    published_project,
    serve,
    write_archive,
)

ARCHIVE_PACKAGES = [Package("libssl3", "3.0.22-1~deb12u2", changelog=OPENSSL_CHANGELOG),
                    Package("libssl3", "3.0.21-1~deb12u1"),  # an older fix still listed: the newest one counts
                    Package("base-files", "12.4+deb12u5"),  # the installed version: nothing to fix
                    Package("tzdata", "2025b-0+deb12u1", arch="all")]
TODAY = dt.date(2026, 11, 25)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return make_key(folder, "archive"), make_key(folder, "impostor")


# ------------------------------------------------------------------------------------------------- pure logic

@pytest.mark.parametrize(("installed", "fixed", "fixable"), [
    ("3.0.9-1", "3.0.19-1", True),  # string order says 3.0.9 > 3.0.19: dpkg's does not
    ("3.0.19-1~deb12u1", "3.0.19-1", True),  # a tilde sorts before everything, even the end
    ("3.0.19-1", "3.0.19-1~deb12u1", False),
    ("1:2.0-1", "2.1-1", False),  # an epoch outranks the upstream version
    ("2.1-1", "1:2.0-1", True),
    ("12.4+deb12u5", "12.4+deb12u5", False),
])
def test_versions_compare_as_dpkg_compares_them(installed, fixed, fixable):
    candidates = {("pkg", "amd64"): security.Candidate("pkg", fixed, "amd64", "pool/p.deb")}
    updates = security.fixable_updates([security.Installed("pkg", installed, "amd64")], candidates)
    assert bool(updates) is fixable


def test_only_changelog_entries_newer_than_the_installed_version_count():
    cves, since = security.changelog_fixes(OPENSSL_CHANGELOG, "3.0.19-1~deb12u1")
    assert cves == ("CVE-2026-28387", "CVE-2026-31789", "CVE-2026-7383")
    assert since == "2026-02-02"  # the oldest fix the image lacks
    assert security.changelog_fixes(OPENSSL_CHANGELOG, "3.0.22-1~deb12u2") == ((), "")


def test_an_sbom_without_os_packages_is_refused_naming_the_file():
    document = cyclonedx(Inventory({"ID": "debian"}, [], [("torch", "2.13.0")]), "r", "sha256:" + "a" * 64, "i", "t")
    with pytest.raises(InputError, match="lists no dpkg packages"):
        security.sbom_packages(document, "catalog/sbom/x.cdx.json")
    with pytest.raises(InputError, match="not a CycloneDX SBOM"):
        security.sbom_packages([], "catalog/sbom/x.cdx.json")
    full = cyclonedx(Inventory({"ID": "debian", "VERSION_ID": "12"}, [("libssl3", "1:3.0~rc1-1", "amd64")], []),
                     "r", "sha256:" + "a" * 64, "i", "t")
    assert security.sbom_packages(full, "x") == [security.Installed("libssl3", "1:3.0~rc1-1", "amd64")]


def test_os_release_names_the_compat_os():
    compat = {"os": {"debian12": {}, "rocky9": {"os_release": "rocky9.4"}}}
    assert security.os_for_release(compat, {"ID": "debian", "VERSION_ID": "12"}) == "debian12"
    assert security.os_for_release(compat, {"ID": "rocky", "VERSION_ID": "9.4"}) == "rocky9"
    assert security.os_for_release(compat, {"ID": "alpine", "VERSION_ID": "3.20"}) is None


def fixable(package="libssl3", cves=("CVE-2026-28387", "CVE-2026-7383")):
    return security.RowSecurity("row", "debian12", "bookworm-security index", "verified",
                                [security.Fixable(package, "amd64", "3.0.19-1~deb12u1", "3.0.22-1~deb12u2", cves)])


def allow(*entries):
    return Allowlist(tuple(AllowedVulnerability(name, "not reachable", expires) for name, expires in entries),
                     path="scanner-allowlist.yaml")


def test_fixable_updates_block_unless_the_package_or_every_cve_is_allowlisted_and_not_expired():
    later, earlier = TODAY + dt.timedelta(days=30), TODAY - dt.timedelta(days=1)
    blocked = security_gate.judge([fixable()], allow(), TODAY)
    assert blocked.status == "failed" and "libssl3 3.0.19-1~deb12u1 -> 3.0.22-1~deb12u2" in blocked.message
    assert "scanner-allowlist.yaml" in blocked.message and blocked.scanner == "bookworm-security index"
    assert security_gate.judge([fixable()], allow(("libssl3", later)), TODAY).status == "passed"
    assert security_gate.judge([fixable()], allow(("CVE-2026-28387", later), ("CVE-2026-7383", later)), TODAY).status == "passed"
    assert security_gate.judge([fixable()], allow(("CVE-2026-28387", later)), TODAY).status == "failed"  # one CVE left
    expired = security_gate.judge([fixable()], allow(("libssl3", earlier)), TODAY)
    assert expired.status == "failed" and f"allowlist entry expired {earlier}" in expired.message
    assert security_gate.judge([fixable(cves=())], allow(), TODAY).status == "failed"  # no CVE named: still a fix
    assert security_gate.judge([security.RowSecurity("row", "debian12", "x")], allow(), TODAY).status == "passed"


def test_an_unreadable_index_blocks_publishing():
    verdict = security_gate.judge([security.RowSecurity("row", "debian12", "bookworm-security index", error="timed out")],
                             allow(), TODAY)
    assert verdict.status == "failed" and "timed out" in verdict.message


def test_the_merged_verdict_names_each_source_that_judged():
    index = security_gate.judge([fixable()], allow(), TODAY)
    trivy = ScanResult("passed", "trivy", "trivy: no unallowed findings")
    merged = security_gate.merge([index, trivy])
    assert merged.status == "failed" and merged.scanner == "bookworm-security index + trivy"
    assert "judged by bookworm-security index + trivy" in merged.message
    skipped = ScanResult("skipped", message="vulnerability scan skipped: neither trivy nor grype is installed")
    alone = security_gate.merge([security_gate.judge([fixable()], allow(("libssl3", TODAY)), TODAY), skipped])
    assert alone.status == "passed" and alone.scanner == "bookworm-security index" and "skipped" in alone.message


def test_the_allowlist_takes_packages_as_well_as_cves(tmp_path):
    path = tmp_path / "scanner-allowlist.yaml"
    path.write_text("allow:\n  - {package: libssl3, reason: rebuilt weekly, expires: 2026-12-31}\n"
                    "  - {cve: CVE-2026-7383, reason: no TLS server, expires: 2026-12-31}\n")
    assert [entry.id for entry in load_allowlist(path).entries] == ["libssl3", "CVE-2026-7383"]
    path.write_text("allow:\n  - {package: libssl3, cve: CVE-2026-7383, reason: x, expires: 2026-12-31}\n"
                    "  - {package: 'Not A Package', reason: x, expires: 2026-12-31}\n")
    with pytest.raises(InputError) as raised:
        load_allowlist(path)
    assert [problem.line for problem in raised.value.problems] == [2, 3]
    assert "cve (or package)" in str(raised.value.problems[0])
    assert "must be an OS package name" in str(raised.value.problems[1])


# --------------------------------------------------------------------------------- the index over HTTP (127.0.0.1)

def test_a_row_behind_the_security_pocket_is_fixable_with_version_cves_and_date(tmp_path, keys):
    archive, _ = keys
    root = write_archive(tmp_path / "mirror", archive, ARCHIVE_PACKAGES)
    with serve(root) as url:
        row = check(url, str(archive.keyring))
    assert not row.error, row.error
    assert row.signature == f"signature verified with {archive.keyring}"
    assert [item.to_json() for item in row.fixable] == [{
        "package": "libssl3", "arch": "amd64", "installed": "3.0.19-1~deb12u1", "fixed": "3.0.22-1~deb12u2",
        "cves": ["CVE-2026-28387", "CVE-2026-31789", "CVE-2026-7383"], "since": "2026-02-02"}]


def test_a_saved_index_in_a_folder_works_offline(tmp_path, keys):
    archive, _ = keys
    root = write_archive(tmp_path / "saved", archive, ARCHIVE_PACKAGES)
    row = check(str(root), str(archive.keyring))
    assert [item.fixed for item in row.fixable] == ["3.0.22-1~deb12u2"]


def test_without_the_keyring_on_the_host_the_row_is_judged_and_says_the_signature_was_not_checked(tmp_path, keys):
    archive, _ = keys
    root = write_archive(tmp_path / "mirror", archive, ARCHIVE_PACKAGES)
    row = check(str(root), str(tmp_path / "absent.gpg"))
    assert row.fixable and "signature not checked" in row.signature and "absent.gpg" in row.signature


def test_a_release_signed_by_another_key_is_refused(tmp_path, keys):
    archive, impostor = keys
    root = write_archive(tmp_path / "mirror", impostor, ARCHIVE_PACKAGES)
    row = check(str(root), str(archive.keyring))
    assert not row.fixable and "the Release signature does not verify" in row.error


def test_a_truncated_index_is_refused(tmp_path, keys):
    archive, _ = keys
    good = lzma.compress(b"Package: libssl3\nVersion: 3.0.22-1~deb12u2\nArchitecture: amd64\n")
    root = write_archive(tmp_path / "mirror", archive, [], packages_xz=good[:-20], release_packages_xz=good)
    row = check(str(root), str(archive.keyring))
    assert "truncated or replaced" in row.error


def test_a_truncated_xz_stream_that_the_release_file_vouches_for_is_refused(tmp_path, keys):
    archive, _ = keys
    cut = lzma.compress(b"Package: libssl3\nVersion: 3.0.22-1~deb12u2\nArchitecture: amd64\n" * 50)[:-30]
    row = check(str(write_archive(tmp_path / "mirror", archive, [], packages_xz=cut)), str(archive.keyring))
    assert "ends early" in row.error or "not xz-compressed" in row.error


def test_an_index_not_compressed_as_named_is_refused(tmp_path, keys):
    archive, _ = keys
    plain = b"Package: libssl3\nVersion: 3.0.22-1~deb12u2\nArchitecture: amd64\n"
    row = check(str(write_archive(tmp_path / "mirror", archive, [], packages_xz=plain)), str(archive.keyring))
    assert "not xz-compressed as its name says" in row.error


def test_a_huge_index_is_refused_before_it_is_read_whole(tmp_path, keys, monkeypatch):
    archive, _ = keys
    monkeypatch.setattr(security, "MAX_INDEX_BYTES", 1024)
    big = lzma.compress(os.urandom(4096))  # random bytes do not compress: over 1 KiB
    root = write_archive(tmp_path / "mirror", archive, [], packages_xz=big)
    with serve(root) as url:
        row = check(url, str(archive.keyring))
    assert "larger than" in row.error


def test_an_index_that_unpacks_to_too_much_is_refused(tmp_path, keys, monkeypatch):
    archive, _ = keys
    monkeypatch.setattr(security, "MAX_UNPACKED_BYTES", 4096)
    bomb = lzma.compress(b"\n" * 1_000_000)
    row = check(str(write_archive(tmp_path / "mirror", archive, [], packages_xz=bomb)), str(archive.keyring))
    assert "unpacks to more than" in row.error


def test_a_slow_server_is_given_up_on_within_the_deadline(tmp_path, keys):
    archive, _ = keys
    root = write_archive(tmp_path / "mirror", archive, ARCHIVE_PACKAGES)
    with serve(root, drips=True) as url:
        row = check(url, str(archive.keyring), read_timeout=5, deadline=1.0)
    assert "not read within 1 s" in row.error


def test_a_release_file_listing_no_such_component_is_an_error(tmp_path, keys):
    archive, _ = keys
    root = write_archive(tmp_path / "mirror", archive, ARCHIVE_PACKAGES)
    compat = compat_for(str(root), str(archive.keyring))
    compat["os"]["debian12"]["security"]["components"] = ["contrib"]
    row = security.Checker(compat, "compat.yaml").check("row", "debian12", INSTALLED)
    assert "the Release file lists no such index" in row.error


# ------------------------------------------------------------------------------------------------- the command


def test_the_security_command_lists_each_published_rows_fixable_packages(tmp_path, keys):
    archive, _ = keys
    root = write_archive(tmp_path / "mirror", archive, ARCHIVE_PACKAGES)
    args = published_project(tmp_path, "http://unused.invalid", str(archive.keyring),
                             [(p.name, p.version, p.arch) for p in INSTALLED])
    shown = run_cli_in_process(*args, "--mirror", str(root))
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "1 fixable OS packages (bookworm-security index, signature verified" in shown.stdout
    assert "3.0.22-1~deb12u2" in shown.stdout and "CVE-2026-28387" in shown.stdout and "2026-02-02" in shown.stdout
    as_json = json.loads(run_cli_in_process(*args, "--mirror", str(root), "--format", "json").stdout)
    assert as_json["rows"][0]["fixable"][0]["cves"] == ["CVE-2026-28387", "CVE-2026-31789", "CVE-2026-7383"]
    with serve(root) as url:  # the mirror compat.yaml names, over HTTP
        args = published_project(tmp_path / "again", url, str(archive.keyring), [("base-files", "12.4+deb12u5", "amd64")])
        clean = run_cli_in_process(*args)
    assert clean.returncode == 0 and "no fixable OS packages" in clean.stdout, clean.stdout + clean.stderr


def test_the_security_command_refuses_an_sbom_without_os_packages_with_exit_2(tmp_path, keys):
    archive, _ = keys
    args = published_project(tmp_path, "http://unused.invalid", str(archive.keyring), [])
    refused = run_cli_in_process(*args)
    assert refused.returncode == 2 and "lists no dpkg packages" in refused.stderr and "Traceback" not in refused.stderr


def test_the_security_command_says_when_the_index_is_not_trusted(tmp_path, keys):
    archive, impostor = keys
    root = write_archive(tmp_path / "mirror", impostor, ARCHIVE_PACKAGES)
    args = published_project(tmp_path, str(root), str(archive.keyring), [(p.name, p.version, p.arch) for p in INSTALLED])
    refused = run_cli_in_process(*args)
    assert refused.returncode == 1 and "the Release signature does not verify" in refused.stdout
    assert "Traceback" not in refused.stderr


def test_gpg_tools_are_present():
    assert shutil.which("gpg") and shutil.which("gpgv"), "the security tests sign a Release file with gpg"


def test_the_test_archives_signing_key_leaves_no_gpg_agent_running(tmp_path):
    from .security_fixtures import agents_of, clearsign
    key = make_key(tmp_path, "agent")
    clearsign(key, "Origin: Debian\n")
    assert agents_of(key.home) == []


def test_the_gate_skips_an_os_without_an_archive_and_blocks_an_image_without_packages_where_it_has_one(tmp_path, keys):
    archive, _ = keys
    root = write_archive(tmp_path / "mirror", archive, ARCHIVE_PACKAGES)
    assert security_gate.gate(None, "row", "debian12", [], allow(), TODAY).status == "skipped"
    without = security.Checker({"os": {"debian12": {"family": "apt"}}, "families": {"apt": {}}}, "compat.yaml")
    skipped = security_gate.gate(without, "row", "debian12", [("libssl3", "3.0.19-1~deb12u1", "amd64")], allow(), TODAY)
    assert skipped.status == "skipped" and "debian12 has no security archive in compat.yaml" in skipped.message
    checker = security.Checker(compat_for(str(root), str(archive.keyring)), "compat.yaml")
    assert "lists no dpkg packages" in security_gate.gate(checker, "row", "debian12", [], allow(), TODAY).message
    debs = [(p.name, p.version, p.arch) for p in INSTALLED]
    assert security_gate.gate(checker, "row", "debian12", debs, allow(), TODAY).status == "failed"
    assert security_gate.gate(checker, "row", "debian12", debs, allow(("libssl3", TODAY)), TODAY).status == "passed"


# ------------------------------------------------------------------------------------------------- the nightly


def test_the_nightly_rebuilds_a_published_row_whose_os_has_fixes_and_lists_them(tmp_path, keys):
    archive, _ = keys
    root = write_archive(tmp_path / "mirror", archive, ARCHIVE_PACKAGES)
    run, specs, catalog = nightly_for(tmp_path, str(root), str(archive.keyring),
                                      [(p.name, p.version, p.arch) for p in INSTALLED])
    due = run.security_due(specs, catalog)
    assert list(due) == ["2.13.0-cpu-runtime"] and due["2.13.0-cpu-runtime"] == security.refresh_token(
        [security.Fixable("libssl3", "amd64", "3.0.19-1~deb12u1", "3.0.22-1~deb12u2")])
    assert not run.summary.skipped and not run.summary.unchanged
    assert any("rebuilt for OS security fixes (bookworm-security index), its venv layers reused: libssl3 "
               "3.0.19-1~deb12u1 -> 3.0.22-1~deb12u2 (CVE-2026-28387, CVE-2026-31789, CVE-2026-7383)" in note
               for note in run.summary.notes), run.summary.notes


def test_the_nightly_still_skips_a_published_row_with_nothing_to_fix_in_seconds(tmp_path, keys):
    import time

    archive, _ = keys
    root = write_archive(tmp_path / "mirror", archive, ARCHIVE_PACKAGES)
    run, specs, catalog = nightly_for(tmp_path, str(root), str(archive.keyring), [("base-files", "12.4+deb12u5", "amd64")])
    started = time.monotonic()
    assert run.security_due(specs, catalog) == {}
    assert time.monotonic() - started < 5
    assert run.summary.skipped == ["2.13.0-cpu-runtime"] == run.summary.unchanged


def test_a_nightly_that_cannot_read_the_index_rebuilds_nothing_and_says_why(tmp_path, keys):
    archive, impostor = keys
    root = write_archive(tmp_path / "mirror", impostor, ARCHIVE_PACKAGES)
    run, specs, catalog = nightly_for(tmp_path, str(root), str(archive.keyring),
                                      [(p.name, p.version, p.arch) for p in INSTALLED])
    assert run.security_due(specs, catalog) == {}
    assert any("its security fixes were not looked up" in note and "does not verify" in note
               for note in run.summary.notes)


def test_a_security_rebuild_passes_its_token_as_a_build_arg_outside_the_input_hash(tmp_path):
    from torchimages.build.builder import SECURITY_REFRESH_ARG, BuildOptions, build_args
    from torchimages.build.context import build_context
    from torchimages.build_inputs.server import token_arg
    from torchimages.matrix.load import load_matrix

    matrix = copy_fixture_project(tmp_path / "project")
    spec = next(s for s in load_matrix(matrix).specs if s.tag == "2.13.0-cpu-runtime")
    (tmp_path / "images" / spec.tag).mkdir(parents=True)
    (tmp_path / "images" / spec.tag / "Dockerfile").write_text("FROM debian:bookworm\n")
    plain = BuildOptions(tmp_path / "images", tmp_path / "reports")
    refresh = BuildOptions(tmp_path / "images", tmp_path / "reports", security_refresh={spec.tag: "abc"})
    context = build_context(spec, plain, "base", "")
    token_only = {name: f"torchimages-build-inputs,{token_arg('t')}" for name in ("NO_PROXY", "no_proxy")}
    assert build_args(refresh, context, spec.tag, "t") == {**context.layer_args, SECURITY_REFRESH_ARG: "abc", **token_only}
    assert build_args(plain, context, spec.tag, "t") == {**context.layer_args, **token_only}
    assert context.input_hash == build_context(spec, refresh, "base", "").input_hash


def test_every_rendered_image_ends_with_its_os_security_layer(fixture_project):
    """Every Dockerfile the fixture project renders (each of its OSes, CPU and CUDA, runtime and devel)."""
    dockerfiles = sorted((fixture_project / "images").glob("*/Dockerfile"))
    assert dockerfiles
    for dockerfile in dockerfiles:
        text = dockerfile.read_text()
        final = text[text.rindex("\nFROM "):]
        # The step begins by marking its start (issue 47: os_step_begin), then updates and upgrades.
        security_step = final.split("ARG OS_SECURITY_REFRESH=none\nRUN ", 1)
        assert len(security_step) == 2 and "apt-get update" in security_step[1], dockerfile
        assert "apt-get upgrade -y" in final, dockerfile
        assert final.index("OS_SECURITY_REFRESH") > final.rindex("/tmp/install_layer.py --inputs"), dockerfile
        assert final.index("OS_SECURITY_REFRESH") > final.rindex("COPY "), dockerfile


def test_an_expired_release_file_is_refused(tmp_path, keys):
    """A Release file past its Valid-Until: a stale mirror, or an old signed index replayed to hide newer fixes."""
    from .security_fixtures import clearsign

    archive, _ = keys
    root = write_archive(tmp_path / "mirror", archive, ARCHIVE_PACKAGES)
    release = root / "dists" / SUITE / "InRelease"
    text = release.read_text()
    body = text.split("\n\n", 1)[1].split("\n-----BEGIN PGP SIGNATURE", 1)[0]
    release.write_bytes(clearsign(archive, "Valid-Until: Sat, 01 Nov 2025 00:00:00 UTC\n" + body + "\n"))
    row = check(str(root), str(archive.keyring))
    assert "the Release file expired 2025-11-01" in row.error


def test_a_changelog_bomb_is_not_unpacked(monkeypatch):
    from .security_fixtures import make_deb

    monkeypatch.setattr(security, "MAX_UNPACKED_BYTES", 1 << 16)
    assert security.deb_changelog(make_deb("libssl3", "small"), "libssl3") == "small"
    assert security.deb_changelog(make_deb("libssl3", "0" * (1 << 20)), "libssl3") is None  # 1 MiB from a few KB


def test_a_native_packages_changelog_is_read_too():
    import gzip

    from .security_fixtures import ar, tar_xz

    deb = ar({"debian-binary": b"2.0\n", "data.tar.xz": tar_xz(
        {"./usr/share/doc/apt/changelog.gz": gzip.compress(b"apt (2.6.2) bookworm; urgency=medium\n")})})
    assert security.deb_changelog(deb, "apt") == "apt (2.6.2) bookworm; urgency=medium\n"


def test_a_login_in_the_mirror_url_is_never_printed(tmp_path, keys):
    archive, _ = keys
    args = published_project(tmp_path, "http://unused.invalid", str(archive.keyring),
                             [(p.name, p.version, p.arch) for p in INSTALLED])
    shown = run_cli_in_process(*args, "--mirror", "http://ci:s3cret-mirror-pass@127.0.0.1:9/debian-security")
    assert shown.returncode == 1 and "127.0.0.1:9" in shown.stdout
    assert "s3cret-mirror-pass" not in shown.stdout + shown.stderr
