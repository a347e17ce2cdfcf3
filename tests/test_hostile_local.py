"""Hostile ground, round 6 (issue 56), the local readers: layers a rebuild compares (extended attributes, device
numbers, kinds of link, sparse files, file names with control characters), key URIs (a PIN's end, a slot number),
the security index's dates, and gpu-record's facts (mistyped fields, tens of thousands of GPUs, a device name that
forges a row). No engine, no token, no network: each test feeds the reader the input and checks the contract (one
line, exit 1 or 2, no traceback, bounded work). A test that could hang on today's code runs under an alarm."""
from __future__ import annotations

import copy
import datetime as dt
import io
import json
import tarfile
from pathlib import Path

import pytest

from torchimages.model import InputError
from torchimages.security import freshness as security
from torchimages.security import promise
from torchimages.trust.keys import redacted
from torchimages.trust.keys_pkcs11 import KeyReference
from torchimages.trust.layer_diff import first_differing_file, layer_entries

from .gpu_fixtures import CU130, gpu_record, saved_facts
from .hostile_fixtures import within

ESCAPE = "\x1b]0;owned\x07\x1b[2J"


def layer(*entries: tarfile.TarInfo, data: dict[str, bytes] | None = None) -> io.BytesIO:
    """An uncompressed PAX layer tar of these entries (a file's bytes from data, by name)."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in entries:
            content = (data or {}).get(entry.name, b"")
            entry.size = len(content) if entry.isfile() else 0
            archive.addfile(entry, io.BytesIO(content) if entry.isfile() else None)
    stream.seek(0)
    return stream


def entry(name: str, kind: bytes = tarfile.REGTYPE, **attributes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mtime = kind, 5
    for key, value in attributes.items():
        setattr(info, key, value)
    return info


def difference(ours: tarfile.TarInfo, theirs: tarfile.TarInfo) -> str | None:
    return first_differing_file(layer_entries(layer(ours)), layer_entries(layer(theirs)))


CAPABILITY = {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00"}


@pytest.mark.parametrize(("ours", "theirs", "named"), [
    (entry("usr/bin/ping"), entry("usr/bin/ping", pax_headers=CAPABILITY), "SCHILY.xattr.security.capability"),
    (entry("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3),
     entry("dev/null", tarfile.CHRTYPE, devmajor=8, devminor=0), "device"),
    (entry("bin/sh", tarfile.SYMTYPE, linkname="bin/bash"), entry("bin/sh", tarfile.LNKTYPE, linkname="bin/bash"),
     "kind"),
], ids=["xattr", "device numbers", "hard or symbolic link"])
def test_layer_diff_names_every_attribute_an_extraction_applies(ours, theirs, named):
    """A layer that differs only in a file capability, a device's numbers or the kind of link was 'no file differs
    (the tars differ in their order or headers only)'."""
    found = difference(ours, theirs)
    assert found is not None and f"(differs in {named})" in found, found


def sparse_layer(claimed_size: int, sparse_map: str, stored: bytes = b"hello") -> io.BytesIO:
    """A PAX (GNU 0.1) sparse file claiming claimed_size bytes, storing only its map's blocks, then a plain file."""
    big = entry("var/big", pax_headers={"GNU.sparse.map": sparse_map, "GNU.sparse.size": str(claimed_size)})
    return layer(big, entry("etc/after"), data={"var/big": stored, "etc/after": b"abc"})


def test_layer_diff_hashes_a_sparse_file_by_what_it_stores_not_by_its_claimed_size():
    """A sparse file claiming a terabyte kept the check hashing zeros for ever."""
    with within(20):
        ours = list(layer_entries(sparse_layer(1 << 40, "0,5")))
        theirs = list(layer_entries(sparse_layer(1 << 40, "0,5", b"HELLO")))
    assert [item.path for item in ours] == ["var/big", "etc/after"] and ours[0].size == 1 << 40
    assert ours[0].content.startswith("sparse sha256:") and ours[0].content != theirs[0].content
    with within(20):
        damaged = list(layer_entries(sparse_layer(1 << 40, f"0,{1 << 39}")))
    assert damaged[0].content.startswith("a damaged sparse map") and damaged[1].path == "etc/after"


def test_layer_diff_shows_a_file_name_with_control_characters_inert():
    name = f"etc/{ESCAPE}\nonly in theirs: forged"
    found = first_differing_file(layer_entries(layer(entry("etc/a"))),
                                 layer_entries(layer(entry("etc/a"), entry(name, tarfile.SYMTYPE, linkname=ESCAPE))))
    assert found is not None and found.startswith("only in theirs: etc/")
    assert "\x1b" not in found and "\n" not in found and "\x07" not in found and "\\x1b" in found


@pytest.mark.parametrize("pin", ["12;34", "12;x=34"])
def test_redacted_hides_the_pin_the_key_reference_reads(pin, tmp_path):
    """The redaction ended a PIN at ';' where the parser did not: 'pin-value=...;34'."""
    module = tmp_path / "module.so"
    module.write_bytes(b"")
    uri = f"pkcs11:token=t;object=k?module-path={module}&pin-value={pin}&x=1"
    reference = KeyReference(uri, {})
    assert reference.pin is not None and reference.pin.startswith("12") and reference.pin.endswith("34")
    assert "34" not in redacted(uri) and "pin-value=...&x=1" in redacted(uri)
    # The parser reads no PIN in the path; one written there is hidden too, to where the path's attribute ends.
    assert redacted("pkcs11:token=t;pin-value=5678;object=k") == "pkcs11:token=t;pin-value=...;object=k"


@pytest.mark.parametrize("slot", ["²", "٣", "9" * 5000, str(2**64)])
def test_key_reference_refuses_a_slot_id_that_is_not_a_pkcs11_slot_number(slot, tmp_path):
    """'²' passed str.isdigit and int() raised; 5000 digits passed and int() raised."""
    module = tmp_path / "module.so"
    module.write_bytes(b"")
    with pytest.raises(InputError) as refused:
        KeyReference(f"pkcs11:slot-id={slot};object=k?module-path={module}&pin-value=1234", {})
    [line] = str(refused.value).splitlines()
    assert "is not a slot number" in line and len(line) < 800 and "1234" not in line


RELEASE = ("Origin: Debian\nCodename: bookworm-security\nDate: {date}\nSHA256:\n"
           " " + "a" * 64 + " 10 main/binary-amd64/Packages.xz\n")


def test_parse_release_refuses_a_date_it_cannot_read():
    """An unreadable Date skipped the future-date check altogether."""
    with pytest.raises(security.SecurityIndexError, match="Date 'the day after tomorrow' is not a date"):
        security.parse_release(RELEASE.format(date="the day after tomorrow"), "InRelease")
    _, published = security.parse_release(RELEASE.format(date="Sat, 21 Nov 2026 02:00:00 UTC"), "InRelease")
    assert published == dt.datetime(2026, 11, 21, 2, tzinfo=dt.timezone.utc)


FUTURE_CHANGELOG = """openssl (3.0.22-1~deb12u2) bookworm-security; urgency=high

  * Fix CVE-2026-90001.

 -- Debian Security Team <team@security.debian.org>  Fri, 20 Nov 2026 10:00:00 +0000

openssl (3.0.21-1~deb12u1) bookworm-security; urgency=high

  * Fix CVE-2027-00001.

 -- Debian Security Team <team@security.debian.org>  Fri, 01 Jan 2027 10:00:00 +0000
"""


def test_changelog_fixes_dated_after_the_index_are_undated_and_listed_as_behind():
    """A fix dated after its index aged by a negative number of days, and the patch promise never fired."""
    index_date = dt.datetime(2026, 11, 21, 2, tzinfo=dt.timezone.utc)
    cves, since = security.changelog_fixes(FUTURE_CHANGELOG, "3.0.19-1~deb12u1", index_date)
    assert cves == ("CVE-2026-90001", "CVE-2027-00001") and since == ""
    fixes = [security.Fixable("libssl3", "amd64", "1", "2", cves, since),
             security.Fixable("tzdata", "all", "1", "2", (), "2026-11-21")]
    row = security.RowSecurity("2.13.0-cpu-runtime", "debian12", "bookworm-security index", "verified", fixes)
    [over] = promise.over_promise({row.subject: row}, set(), dt.date(2026, 11, 21))
    assert "the oldest undated" in over


@pytest.fixture
def facts(host, tmp_path) -> dict:
    """What `probe.py --gpu-only` saved on a good host, as an object to spoil."""
    return json.loads(Path(saved_facts(tmp_path, host, 712.3)).read_text())


def record_of(tmp_path, facts: dict):
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(facts))
    with within(120):
        return gpu_record(tmp_path, CU130, "--facts", str(path))


@pytest.mark.parametrize(("field", "value"), [
    (("gpu", "devices", 0, "capability"), None), (("gpu", "devices", 0, "capability"), 5),
    (("gpu", "devices", 0, "capability"), ...), (("gpu", "warnings"), 5), (("gpu", "warnings"), [1]),
    (("probe_error",), 5), (("probe_error",), {"a": 1}), (("gpu", "devices", 0, "kernel_error"), [1])])
@pytest.mark.parametrize("host", ["h100x8-nvlink"], indirect=True)
def test_read_gpu_facts_refuses_a_field_the_record_reads_missing_or_mistyped(facts, tmp_path, field, value):
    """Each was a TypeError or KeyError traceback."""
    changed = copy.deepcopy(facts)
    *path, last = field
    node = changed
    for key in path:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    result = record_of(tmp_path, changed)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.splitlines()
    assert "not GPU facts: expected" in line


@pytest.mark.parametrize("host", ["h100x8-nvlink"], indirect=True)
def test_gpu_record_summarises_many_gpus_and_refuses_more_than_a_host_has(facts, tmp_path):
    """Tens of thousands of GPUs made the line take minutes (a count per name per device) and megabytes."""
    first = facts["gpu"]["devices"][0]
    many = copy.deepcopy(facts)
    many["gpu"]["devices"] = [{**first, "name": f"GPU model {number}", "index": number} for number in range(1000)]
    result = record_of(tmp_path, many)
    [line] = result.stdout.splitlines()
    assert "and 996 more kinds (1000 GPUs)" in line and len(line) < 600
    too_many = copy.deepcopy(facts)
    too_many["gpu"]["devices"] = [first] * 20000
    refused = record_of(tmp_path, too_many)
    assert refused.returncode == 2 and "of at most 1024 GPUs" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("host", ["h100x8-nvlink"], indirect=True)
def test_gpu_record_makes_a_device_name_inert_in_its_table_row(facts, tmp_path):
    """A '|' and a newline in nvidia-smi's device name became a second row of the record table."""
    forged = copy.deepcopy(facts)
    forged["gpu"]["devices"][0]["name"] = f"H100 | forged |\n| 2099-01-01 | row {ESCAPE}"
    result = record_of(tmp_path, forged)
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    [line] = result.stdout.splitlines()
    assert line.count(" | ") == 5 and "\x1b" not in line and "H100 \\| forged \\|" in line


def test_key_file_problems_show_a_key_file_name_with_control_characters_inert(tmp_path):
    from torchimages.publish.catalog import KEYS_DIR, key_file_problems

    keys = tmp_path / KEYS_DIR
    keys.mkdir()
    (keys / "evil\x1b[2J\nerror: forged.pub").write_text("not a key")
    [line] = key_file_problems(tmp_path)
    assert "\x1b" not in line and "\n" not in line and "\\x1b[2J\\nerror: forged.pub" in line


def test_check_files_refuses_a_huge_sparse_kept_deb_before_hashing_it(tmp_path):
    from torchimages.build.debs import PinnedDeb, check_files

    pin = PinnedDeb("system", "curl_8.5.0-2_amd64.deb", "0" * 64)
    with open(tmp_path / pin.filename, "wb") as sparse:
        sparse.truncate(1 << 40)  # 1 TiB of nothing: hashing it took hours
    with within(10), pytest.raises(InputError, match="GiB, more than any .deb"):
        check_files(tmp_path, [pin], "run `debs` again")
    with open(tmp_path / pin.filename, "wb") as sparse:
        sparse.truncate(1 << 30)
    with within(10), pytest.raises(InputError, match="a sparse file"):
        check_files(tmp_path, [pin], "run `debs` again")
