"""The fifth hostile-input round (issue 45; docs/hostile-input.md, "The new code"): the security archive's reader,
YAML's constructors, the build-input server and the earlier rounds' leftovers, tried as an attacker would.

The archives are saved indexes in folders or served from 127.0.0.1 (tests/security_fixtures.py); nothing here needs
an engine or leaves this machine. A test that could hang on today's code runs under an alarm, so it fails instead.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from torchimages import yamlsource
from torchimages.model import InputError
from torchimages.security import freshness as security

from .security_fixtures import SUITE, Package, ar, make_deb, make_key, pool_path, serve, write_archive
from .test_security import INSTALLED, check, published_project

ESCAPE = "\x1b]0;owned\x07\x1b[2J"


@pytest.fixture(scope="module")
def archive_key(tmp_path_factory):
    return make_key(tmp_path_factory.mktemp("keys"), "archive")


@contextmanager
def within(seconds: int):
    """Fails the test, instead of hanging it, when the block runs past seconds (a spin or a blocking open)."""
    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s: a hang")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------------------ the security archive

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
    judged = security.judge([row], _allowing("CVE-2020-0001"), dt.date(2026, 11, 25))
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
    from .test_security import compat_for
    return compat_for(url, str(key.keyring))


def _allowing(*ids: str):
    from torchimages.security.sbom import AllowedVulnerability, Allowlist
    return Allowlist(tuple(AllowedVulnerability(key, "not reachable", dt.date(2027, 1, 1)) for key in ids), path="allow.yaml")



# ----------------------------------------------------------------------------------------------------------- YAML

CONSTRUCTOR_TRAPS = ["!!int abc", "2026-02-30", "!!bool maybe", "!!set [a]", "!!timestamp x", "!!map [1]",
                     "!!seq {a: 1}", "!!int 0x", "!!int " + "9" * 5000]


@pytest.mark.parametrize("value", CONSTRUCTOR_TRAPS)
def test_every_constructor_error_is_one_line_at_its_line(value):
    with pytest.raises(InputError) as raised:
        yamlsource.parse_yaml(f"first: 1\nsecond: {value}\n", Path("m.yaml"))
    [problem] = raised.value.problems
    assert (problem.file, problem.line) == ("m.yaml", 2) and "is not a valid" in problem.message
    assert len(str(problem)) < 300


def test_a_top_level_set_is_one_line():
    with pytest.raises(InputError) as raised:
        yamlsource.parse_yaml("!!set [a]\n", Path("m.yaml"))
    assert raised.value.problems[0].line == 1


@pytest.mark.parametrize("value", ["!!int abc", "2026-02-30", "!!bool maybe", "!!set [a]"])
def test_constructor_errors_in_the_matrix_and_compat_data_are_exit_2_naming_the_file(tmp_path, value):
    from .conftest import copy_fixture_project, run_cli_in_process
    matrix = copy_fixture_project(tmp_path / "project")
    compat = matrix.with_name("compat.yaml")
    compat.write_text(compat.read_text() + f"extra_fact: {value}\n")
    refused = run_cli_in_process("--matrix", str(matrix), "list")
    assert refused.returncode == 2 and f"{compat}:" in refused.stderr and "Traceback" not in refused.stderr
    compat.unlink()
    copy_fixture_project(tmp_path / "again")
    matrix = tmp_path / "again" / "matrix.yaml"
    matrix.write_text(matrix.read_text() + f"extra: {value}\n")
    refused = run_cli_in_process("--matrix", str(matrix), "list")
    assert refused.returncode == 2 and f"{matrix}:" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("expires", ["2026-02-30", "!!int abc", "2026-12-31 10:00:00", "2026-12-31T10:00:00Z"])
def test_allowlist_expiry_is_a_date_and_nothing_else(tmp_path, expires):
    from torchimages.security.sbom import load_allowlist
    path = tmp_path / "scanner-allowlist.yaml"
    path.write_text(f"allow:\n  - cve: CVE-2026-12345\n    reason: not reachable\n    expires: {expires}\n")
    with pytest.raises(InputError) as raised:
        load_allowlist(path)
    [problem] = raised.value.problems
    assert problem.file == str(path) and problem.line == 4, str(problem)


def test_the_node_bound_holds_while_composing(monkeypatch):
    monkeypatch.setattr(yamlsource, "MAX_NODES", 1000)
    text = "".join(f"- {n}\n" for n in range(100_000))
    with pytest.raises(InputError) as raised:
        yamlsource.parse_yaml(text, Path("m.yaml"))
    [problem] = raised.value.problems
    assert 900 < problem.line < 1100, str(problem)  # where the bound was crossed, not after the whole file


def test_a_16_mib_file_of_values_is_refused_in_seconds():
    import time
    text = "[" + "1," * (8 << 20) + "1]\n"
    started = time.monotonic()
    with pytest.raises(InputError):
        yamlsource.parse_yaml(text, Path("m.yaml"))
    assert time.monotonic() - started < 5



# ---------------------------------------------------------------------------------------- the build-input server

LAYER_VENV = {"root": "/opt/venv", "site": "/opt/venv/lib/python3.11/site-packages",
              "interpreter": "/opt/venv/bin/python3", "python": "3.11",
              "script_template": "from %(module)s import %(import_name)s\n%(func)s()\n", "uid": 1000, "gid": 0,
              "time": 946684800}


def hostile_wheel(folder: Path, members: dict[str, bytes], name: str = "demo_pkg") -> Path:
    import zipfile
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.replace('/', '_')}-1.0-py3-none-any.whl"
    files = {"demo_pkg-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n", "demo_pkg-1.0.dist-info/RECORD": b"",
             **members}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for member, body in files.items():
            archive.writestr(member, body)
    return path


def layer_of(wheel: Path) -> bytes:
    import io

    from torchimages.build_inputs.unpack import LayerWheel, Venv, read_wheels, unpack
    venv = Venv(**LAYER_VENV)
    read = read_wheels([LayerWheel(wheel, True)], venv)  # validation: before a byte is sent
    out = io.BytesIO()
    unpack(read, venv, out)
    return out.getvalue()


@pytest.mark.parametrize(("members", "name", "said"), [
    ({"/etc/cron.d/owned": b"* * * * * root sh\n"}, "demo_pkg", "outside its folder"),
    ({"demo_pkg/../../../../../etc/passwd": b"x"}, "demo_pkg", "outside its folder"),
    ({"demo_pkg-1.0.data/data/../../../../etc/x": b"x"}, "demo_pkg", "outside its folder"),
    ({"demo_pkg-1.0.data/elsewhere/x": b"x"}, "demo_pkg", "not a scheme folder"),
    ({"demo_pkg-1.0.data/headers/x.h": b"x"}, "../../../../etc", "not a project name"),
    ({"demo_pkg-1.0.dist-info/entry_points.txt": b"[console_scripts]\n../../../etc/x = demo_pkg:main\n"}, "demo_pkg",
     "not a file name"),
])
def test_wheel_members_are_confined_to_their_scheme_folder(tmp_path, members, name, said):
    from torchimages.build_inputs.unpack import WheelError
    with pytest.raises(WheelError) as refused:
        layer_of(hostile_wheel(tmp_path, members, name))
    assert said in str(refused.value)


def test_a_wheel_with_a_bad_crc_is_refused_before_streaming(tmp_path):
    from torchimages.build_inputs.unpack import WheelError
    wheel = hostile_wheel(tmp_path, {"demo_pkg/__init__.py": b"MARKER-" + b"a" * 100})
    data = wheel.read_bytes()
    wheel.write_bytes(data.replace(b"MARKER-", b"MARKED-"))  # stored: the bytes change, the CRC does not
    with pytest.raises(WheelError) as refused:
        layer_of(wheel)
    assert "CRC" in str(refused.value)


def test_a_good_wheel_still_makes_its_layer(tmp_path):
    layer = layer_of(hostile_wheel(tmp_path, {"demo_pkg/__init__.py": b"", "demo_pkg-1.0.data/headers/x.h": b""}))
    assert b"opt/venv/include/site/python3.11/demo_pkg/x.h" in layer


@pytest.mark.parametrize("length", ["99999999999", "-1", "abc", None])
def test_request_bodies_are_bounded(tmp_path, length):
    import http.client

    from torchimages.build_inputs.server import BUILD_INPUTS_PORT, BuildInputsServer, basic_authorization
    with BuildInputsServer({}, "", None, "t" * 48) as served, within(20):
        connection = http.client.HTTPConnection(served.address, BUILD_INPUTS_PORT, timeout=10)
        connection.putrequest("POST", "/layer.tar")
        connection.putheader("Authorization", basic_authorization("t" * 48))
        if length is not None:
            connection.putheader("Content-Length", length)
        connection.endheaders()
        answer = connection.getresponse()
        assert answer.status == 400 and b"Content-Length" in answer.read()


def test_another_local_user_reads_nothing_from_a_build_s_server(tmp_path):
    """The server's loopback address and port show in /proc/net/tcp: a local user (here uid 65534, nobody) asked it for
    pip's settings (the index login), the wheels, the planner and a layer. Without the build's token: 401 and no byte
    of any of them; the install script, the toolkit's published source, is all it serves to anyone."""
    from torchimages.build_inputs.server import BUILD_INPUTS_PORT, BuildInputsServer, basic_authorization

    from .test_build_inputs import make_wheel
    wheel = make_wheel(tmp_path / "wheels", "private_pkg", "1.0", b"PRIVATE-CODE")
    token = "a1" * 24
    attempt = r"""
import json, sys, urllib.error, urllib.request
base, header = sys.argv[1], sys.argv[2]
answers = {}
for method, path in [("GET", "/inputs.json"), ("GET", "/wheels/"), ("GET", "/wheels/private_pkg-1.0-py3-none-any.whl"),
                     ("GET", "/wheels/private_pkg-1.0-py3-none-any.whl.metadata"), ("GET", "/planner.zip"),
                     ("POST", "/layer.tar"), ("GET", "/install_layer.py")]:
    request = urllib.request.Request(base + path, method=method, data=b"{}" if method == "POST" else None,
                                     headers={"Authorization": header} if header else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            answers[path] = [response.status, response.read().decode("latin-1")]
    except urllib.error.HTTPError as error:
        answers[path] = [error.code, error.read().decode("latin-1")]
print(json.dumps(answers))
"""
    with BuildInputsServer({wheel.name: wheel}, "[global]\nindex-url = https://ci:LOGIN-s3cret@mirror/simple\n",
                           None, token) as served, within(60):
        base = f"http://{served.address}:{BUILD_INPUTS_PORT}"
        for header in ("", basic_authorization("b2" * 24), "Basic " + "x" * 10_000):
            result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                                     "-S", "-c", attempt, base, header], capture_output=True, text=True, check=True)
            answers = json.loads(result.stdout)
            public = answers.pop("/install_layer.py")
            assert public[0] == 200 and "def main(" in public[1]
            assert {path: status for path, (status, _) in answers.items()} == dict.fromkeys(answers, 401)
            assert "LOGIN-s3cret" not in result.stdout and "PRIVATE-CODE" not in result.stdout
        result = subprocess.run([sys.executable, "-S", "-c", attempt, base, basic_authorization(token)],
                                capture_output=True, text=True, check=True)
        assert json.loads(result.stdout)["/inputs.json"][0] == 200 and "LOGIN-s3cret" in result.stdout


def test_the_install_script_sends_the_token_it_finds_in_no_proxy(tmp_path, monkeypatch):
    """The build's steps get the token in the predefined no_proxy arg (kept out of the history and the cache key);
    the install script sends it on every request, and stops in one line where a build gave none."""
    import urllib.request

    from torchimages.build_inputs import install_layer
    from torchimages.build_inputs.server import BUILD_INPUTS_PORT, BuildInputsServer, token_arg
    token = "c3" * 24
    monkeypatch.setattr(urllib.request, "_opener", None)  # install_opener's global: restored after the test
    with BuildInputsServer({}, "[global]\n", "PEM", token) as served, within(30):
        install_layer.authorize({"no_proxy": f"torchimages-build-inputs,proxy.corp,{token_arg(token)}"})
        env = install_layer.fetch_settings(f"http://{served.address}:{BUILD_INPUTS_PORT}", str(tmp_path))
        assert Path(env["PIP_CONFIG_FILE"]).read_text() == "[global]\n"
    with pytest.raises(SystemExit, match="no build-input token in no_proxy"):
        install_layer.authorize({"no_proxy": "torchimages-build-inputs"})


# ------------------------------------------------------------------------------------------- the command line

@pytest.mark.parametrize("reference", ["ci:s3cret-ref-pass@registry.example.com/ml/pytorch:2.13",
                                       "https://ci:s3cret-ref-pass@registry.example.com/ml/pytorch:2.13",
                                       "ci:s3cret-ref-pass" + "W" * 80 + "@registry.example.com/ml/pytorch"])
def test_a_login_in_an_image_reference_is_never_printed(tmp_path, reference):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from .conftest import run_cli_in_process
    key = tmp_path / "cosign.pub"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    shown = run_cli_in_process("verify-image", reference, "--key", str(key))
    assert shown.returncode == 2, shown.stderr
    assert "s3cret" not in shown.stdout + shown.stderr, shown.stderr


def test_a_secret_quoted_cut_short_is_redacted_too():
    from torchimages.files import brief
    from torchimages.redaction import Secrets
    password = "s3cret-" + "p" * 80
    secrets = Secrets.in_arguments([f"ci:{password}@host/repo"])
    shown = secrets.redact(f"REF {brief('ci:' + password + '@host/repo')} is not a reference")
    assert "s3cret" not in shown and shown.startswith("REF '<redacted>... (")


# ------------------------------------------------------------------------------------- earlier rounds' leftovers

def test_an_ipv6_index_url_without_its_bracket_is_exit_2(tmp_path):
    from .conftest import copy_fixture_project, run_cli_in_process
    matrix = copy_fixture_project(tmp_path / "project")
    refused = run_cli_in_process("--matrix", str(matrix), "compat", "refresh", "2.16.0", "--index-url", "http://[::1")
    assert refused.returncode == 2 and "--index-url" in refused.stderr and "Traceback" not in refused.stderr
