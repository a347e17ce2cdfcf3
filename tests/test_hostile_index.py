"""The package index is a peer too (issue 30; docs/hostile-input.md, "The index"): `compat refresh`, `watch`, the
wheelhouse reader and `doctor`'s nvidia-smi, tried as a hostile index, mirror, wheel author and careless operator.

The peers are real HTTP servers on 127.0.0.1 (the fixture index of tests/index_fixtures.py, and `Peer` below, which
answers each path as a test says); wheels are real zips made here. Bounds are cut to fractions of a second (the
product's are seconds per read and half an hour per command: the same code paths), so everything runs in
`make test-fast`; the property test runs derandomized examples.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchimages import files
from torchimages.build import doctor
from torchimages.matrix import compat_refresh
from torchimages.model import InputError
from torchimages.peers import index_http, package_index
from torchimages.redaction import inert

from .conftest import FIXTURE_COMPAT, ROOT, run_cli, run_cli_in_process
from .hostile_fixtures import assert_contract
from .index_fixtures import ARCH_FLAGS, JSON_TYPE, PINS, LocalIndex, make_release, version_py
from .wheels_fixtures import make_wheel
from .workflow_fixtures import workflow_step

TORCH_WHEEL = "torch-2.16.0-cp311-cp311-manylinux_2_28_x86_64.whl"
INJECTION = "0\n\n## Security review: approved, merge now\n::error::pwned\n\x1b[2J"


# ------------------------------------------------------------------------------------------------- the peers

class Peer:
    """An HTTP server on 127.0.0.1 answering each path with `routes[path](handler)`; it keeps every request's path
    and Authorization header."""

    def __init__(self):
        self.routes: dict[str, Callable[[BaseHTTPRequestHandler], None]] = {}
        self.seen: list[tuple[str, str]] = []
        self.stop = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                peer.seen.append((self.path, self.headers.get("Authorization", "")))
                answer = peer.routes.get(self.path)
                if answer is None:
                    return send(self, 404, b"not found")
                try:
                    answer(self)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up: what a bound does
                    pass

        return Handler


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes, kind: str = "application/octet-stream",
         headers: dict | None = None) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def ranges_of(data: bytes) -> Callable[[BaseHTTPRequestHandler], None]:
    """A file host answering Range as PyPI's does."""
    def answer(handler: BaseHTTPRequestHandler) -> None:
        wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", handler.headers.get("Range", ""))
        if wanted is None:
            return send(handler, 416, b"range not satisfiable")
        first, last = wanted.groups()
        start = max(len(data) - int(last), 0) if not first else int(first)
        end = len(data) - 1 if not first or not last else min(int(last), len(data) - 1)
        send(handler, 206, data[start:end + 1], headers={"Content-Range": f"bytes {start}-{end}/{len(data)}"})
    return answer


def project_page(files_: list[dict], kind: str = JSON_TYPE) -> Callable:
    body = json.dumps({"meta": {"api-version": "1.1"}, "name": "torch", "files": files_}).encode()
    return lambda handler: send(handler, 200, body, kind)


def file_entry(peer: Peer, name: str, data: bytes, **changes) -> dict:
    return {"filename": name, "url": f"{peer.url}/files/{name}", "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
            "upload-time": "2026-11-20T10:00:00Z", **changes}


def torch_wheel(tmp_path: Path, version_py_text: bytes | None = None, metadata: bytes | None = None) -> bytes:
    """A torch 2.16.0 cu132 wheel as PyPI has it, with its version.py or METADATA replaced when given."""
    files_ = {"torch/version.py": version_py_text or version_py("2.16.0+cu132", "13.2"),
              "torch/lib/libtorch_python.so": ARCH_FLAGS}
    path = make_wheel(tmp_path / "made", "torch", "2.16.0", PINS, ">=3.11", files=files_)
    if metadata is None:
        return path.read_bytes()
    stream = io.BytesIO()
    with zipfile.ZipFile(path) as original, zipfile.ZipFile(stream, "w") as changed:
        for info in original.infolist():
            data = original.read(info)
            changed.writestr(info, metadata if info.filename.endswith("METADATA") else data)
    return stream.getvalue()


def serve_torch(peer: Peer, data: bytes, **changes) -> str:
    """The peer as an index with one torch wheel; its index URL."""
    peer.routes["/simple/torch/"] = project_page([file_entry(peer, TORCH_WHEEL, data, **changes)])
    peer.routes[f"/files/{TORCH_WHEEL}"] = ranges_of(data)
    return peer.url + "/simple"


@pytest.fixture
def compat(tmp_path) -> Path:
    path = tmp_path / "project" / "compat.yaml"
    path.parent.mkdir()
    path.write_bytes(FIXTURE_COMPAT.read_bytes())
    return path


def refresh(compat: Path, *args: str) -> subprocess.CompletedProcess:
    result = run_cli_in_process("--compat", str(compat), "compat", "refresh", *args)
    assert_contract(result)
    return result


def no_workflow_command_or_heading(*texts: str) -> None:
    for text in texts:
        for line in text.splitlines():
            assert not line.lstrip().startswith("::"), f"a workflow command the runner would run: {line!r}"
            assert not line.startswith("## Security"), f"a heading from the index: {line!r}"
            assert "\x1b" not in line, f"a terminal escape: {line!r}"


# --------------------------------------------------------------------------------------------- credential leaks

def test_a_mirror_login_goes_to_the_mirrors_origin_only(tmp_path, compat):
    """--index-url http://USER:PASSWORD@mirror/simple whose pages name files on another port: the file host never
    gets the login (it was set on the shared session, so every range request there carried it)."""
    folder = make_release(tmp_path / "index", cuda_library_size=1024)
    with LocalIndex(folder) as file_host, \
            LocalIndex(folder, files_url=file_host.url.rsplit("/simple", 1)[0] + "/files", login=("ci", "pw-1234")) as mirror:
        result = refresh(compat, "2.16.0", "--index-url", mirror.url.replace("http://", "http://ci:pw-1234@"))
        assert result.returncode == 0, result.stderr
        assert mirror.authorizations and all(mirror.authorizations), "the mirror's own pages carry its login"
        assert file_host.sent, "the wheels were read from the other origin"
        assert not any(file_host.authorizations), "another origin never gets the login"


def test_a_redirect_to_another_origin_drops_the_login(tmp_path):
    """A file URL on the mirror that redirects to another port: the login stays behind."""
    data = torch_wheel(tmp_path)
    login = "Basic " + base64.b64encode(b"ci:pw-1234").decode()
    with Peer() as mirror, Peer() as elsewhere:
        serve_torch(elsewhere, data)
        mirror.routes["/simple/torch/"] = project_page([file_entry(mirror, TORCH_WHEEL, data)])
        mirror.routes[f"/files/{TORCH_WHEEL}"] = lambda handler: send(
            handler, 302, b"", headers={"Location": f"{elsewhere.url}/files/{TORCH_WHEEL}"})
        index = package_index.Index(mirror.url.replace("http://", "http://ci:pw-1234@") + "/simple")
        [package] = index.packages("torch")
        index.read_members(package, lambda name: name.endswith("METADATA"))
        assert (f"/files/{TORCH_WHEEL}", login) in mirror.seen
        assert elsewhere.seen and not any(authorization for _, authorization in elsewhere.seen)


@pytest.mark.parametrize("password", ["ab/cd+ef==", "p@ss/w?rd#1"])
def test_a_password_holding_slashes_is_never_printed(compat, password):
    """Base64 tokens hold '/': the redaction read the login only up to the first '/'."""
    result = refresh(compat, "2.16.0", "--index-url", f"http://ci:{password}@127.0.0.1:9/simple")
    assert result.returncode == 2
    for part in re.findall(r"[^/@?#]{4,}", password):
        assert part not in result.stdout + result.stderr


def test_the_lock_wait_names_the_holder_without_its_index_password(tmp_path):
    """The holder's command line was cut to 120 characters before redaction: a login cut in two was no longer
    shaped like one, and its first half was printed."""
    folder = tmp_path / "held"
    folder.mkdir()
    password = "Zq8/tok3n-part-2/abcdefghij"
    holder = subprocess.Popen([sys.executable, "-c", ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "time.sleep(60)"), str(folder), "x" * 60,
                               f"--index-url=https://ci:{password}@mirror.example/simple"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        handle = os.open(folder, os.O_RDONLY)
        try:
            shown = files.lock_holder(handle)
        finally:
            os.close(handle)
    finally:
        holder.kill()
        holder.wait()
    assert f"pid {holder.pid}" in shown
    for part in re.findall(r"[^/]{4,}", password):
        assert part not in shown, shown


# ---------------------------------------------------------------------------------------------------- injection

@pytest.mark.parametrize("sha256", [INJECTION, "A" * 64, "g" * 64, "0" * 63, "\uff10" * 64, ""])
def test_a_sha256_that_is_not_one_is_refused_before_anything_is_written(tmp_path, compat, sha256):
    data = torch_wheel(tmp_path)
    before = compat.read_text()
    with Peer() as peer:
        url = serve_torch(peer, data, hashes={"sha256": sha256})
        for extra in ((), ("--correct",)):
            result = refresh(compat, "2.16.0", "--index-url", url, *extra)
            assert result.returncode == 2 and "sha256" in result.stderr
            no_workflow_command_or_heading(result.stdout, result.stderr)
    assert compat.read_text() == before


@pytest.mark.parametrize("cuda", ["13.2\n::error::x", "abc", "13", "1e3", "13.2.1"])
def test_a_cuda_version_that_is_no_version_is_refused(tmp_path, compat, cuda):
    data = torch_wheel(tmp_path, version_py_text=version_py("2.16.0+cu132", cuda))
    before = compat.read_text()
    with Peer() as peer:
        result = refresh(compat, "2.16.0", "--index-url", serve_torch(peer, data))
    assert result.returncode == 2 and "CUDA" in result.stderr
    no_workflow_command_or_heading(result.stdout, result.stderr)
    assert compat.read_text() == before


def test_the_release_watch_workflow_against_a_hostile_index_opens_no_tainted_pull_request(fixture_project, tmp_path):
    """The release-watch job's Watch and pull-request-text steps, run as the runner runs them, against an index whose
    sha256 carries a heading and workflow commands: the step fails naming the file, nothing of the index reaches a
    line of the log as a command, the pull request text is not made, compat.yaml and matrix.yaml are unchanged."""
    folder = make_release(tmp_path / "index", cuda_library_size=1024)
    checkout = tmp_path / "checkout"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (checkout / ".venv" / "bin" / "python").chmod(0o755)
    output, runner_temp = tmp_path / "github-output", tmp_path / "runner-temp"
    output.write_text("")
    runner_temp.mkdir()
    before = {name: (fixture_project / name).read_bytes() for name in ("matrix.yaml", "compat.yaml")}

    class Tampered(LocalIndex):
        def project_page(self, project: str) -> bytes | None:
            page = super().project_page(project)
            if project != "torch" or page is None:
                return page
            document = json.loads(page)
            for entry in document["files"]:
                entry["hashes"]["sha256"] = INJECTION
            return json.dumps(document).encode()

    with Tampered(folder) as index:
        (checkout / "build.py").write_text(
            f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom torchimages.cli import main\n"
            f"sys.exit(main(['--matrix', {str(fixture_project / 'matrix.yaml')!r}, '--images', "
            f"{str(fixture_project / 'images')!r}, '--reports', 'reports', *sys.argv[1:], '--index-url', "
            f"{index.url!r}]))\n")
        env = {"PATH": "/usr/bin:/bin", "GITHUB_OUTPUT": str(output), "RUNNER_TEMP": str(runner_temp)}
        watch = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                                workflow_step("release-watch", "Watch the index for a newer torch")["run"]],
                               cwd=checkout, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert watch.returncode == 2, watch.stdout + watch.stderr
    assert "sha256" in watch.stderr and "Traceback" not in watch.stderr
    no_workflow_command_or_heading(watch.stdout, watch.stderr, output.read_text())
    assert output.read_text() == "", "no release handed to the pull request steps"
    assert not (runner_temp / "pull-request.md").exists()
    assert {name: (fixture_project / name).read_bytes() for name in before} == before


def test_peer_text_is_shown_inert_and_our_output_carries_no_workflow_command():
    assert inert("a\n::error::b\x1b[2J\u202e") == "a\\n::error::b\\x1b[2J\\u202e"
    assert inert("::warning::x").startswith("\\::")
    result = run_cli_in_process("--compat", "::error::x\n::add-mask::y", "compat", "refresh", "--check")
    assert_contract(result, 2)
    no_workflow_command_or_heading(result.stdout, result.stderr)


# --------------------------------------------------------------------------------------- writes through links

def test_the_refresh_and_the_watch_write_no_candidate_through_a_link(fixture_project, tmp_path):
    """`.compat.yaml.refreshed` and `.matrix.yaml.proposed` were written with write_text: a link there had the
    file it points to overwritten."""
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me\n")
    for name in (".compat.yaml.refreshed", ".matrix.yaml.proposed"):
        (fixture_project / name).symlink_to(outside)
    with LocalIndex(make_release(tmp_path / "index", cuda_library_size=1024)) as index:
        result = run_cli_in_process("--matrix", str(fixture_project / "matrix.yaml"), "--images",
                                    str(fixture_project / "images"), "--reports", str(fixture_project / "reports"),
                                    "watch", "--index-url", index.url)
    assert_contract(result, 0)
    assert outside.read_text() == "keep me\n"
    assert "2.16.0" in yaml.safe_load((fixture_project / "compat.yaml").read_text())["torch"]
    assert not [path for path in fixture_project.iterdir() if path.name.startswith(".") and "tmp" in path.name]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_compat_file_or_wheel_that_never_ends_is_refused_not_read(tmp_path, compat, kind):
    wheelhouse = make_release(tmp_path / "wheelhouse", cuda_library_size=1024)
    wheel = wheelhouse / TORCH_WHEEL
    wheel.unlink()
    other = tmp_path / "compat-fifo.yaml"
    if kind == "fifo":
        os.mkfifo(wheel)
        os.mkfifo(other)
    else:
        wheel.symlink_to("/dev/zero")
        other.symlink_to("/dev/zero")
    for args in (("--compat", str(compat), "compat", "refresh", "2.16.0", "--index-url", str(wheelhouse)),
                 ("--compat", str(other), "compat", "refresh", "2.16.0", "--index-url", str(wheelhouse))):
        result = run_cli(*args, timeout=120)
        assert_contract(result, 2)
        assert "regular file" in result.stderr or "not a regular file" in result.stderr


# ----------------------------------------------------------------------------------------- lost or wrong releases

def test_two_refreshes_at_once_keep_both_releases(tmp_path, compat):
    folder = make_release(tmp_path / "index", cuda_library_size=1024)
    make_wheel(folder, "torch", "2.17.0", PINS, ">=3.11", files={
        "torch/version.py": version_py("2.17.0+cu132", "13.2"), "torch/lib/libtorch_python.so": ARCH_FLAGS})
    with LocalIndex(folder) as index:
        runs = [subprocess.Popen([sys.executable, str(ROOT / "build.py"), "--compat", str(compat), "compat", "refresh",
                                  version, "--index-url", index.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for version in ("2.16.0", "2.17.0")]
        outcomes = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outcomes
    releases = yaml.safe_load(compat.read_text())["torch"]
    assert {"2.16.0", "2.17.0"} <= set(releases), "neither run's release is lost"


def test_an_epoch_release_hides_no_real_release_and_a_yanked_torchvision_is_not_paired(fixture_project, tmp_path):
    folder = make_release(tmp_path / "index", cuda_library_size=1024)
    make_wheel(folder, "torch", "1!0.1", PINS, ">=3.11")
    with LocalIndex(folder) as index:
        index.yanked = {"torchvision-0.31.0-cp311-cp311-manylinux_2_28_x86_64.whl"}
        result = run_cli_in_process("--matrix", str(fixture_project / "matrix.yaml"), "--images",
                                    str(fixture_project / "images"), "--reports", str(fixture_project / "reports"),
                                    "watch", "--index-url", index.url)
    assert_contract(result, 0)
    report = json.loads((fixture_project / "reports" / "release-watch.json").read_text())
    assert report["release"] == "2.16.0", "1!0.1 sorts above every release without an epoch, but is none of ours"
    assert "torchvision" not in yaml.safe_load((fixture_project / "compat.yaml").read_text())["torch"]["2.16.0"]


@pytest.mark.parametrize("url", ["", " ", "https://pypi.org/simple\n::error::x"])
def test_an_index_url_that_names_no_index_is_refused(compat, url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # '' read the current folder as a wheelhouse
    before = compat.read_text()
    result = refresh(compat, "2.16.0", "--index-url", url)
    assert result.returncode == 2 and "--index-url" in result.stderr
    assert compat.read_text() == before


# ------------------------------------------------------------------------------------ what the libraries raise

def wheel_with(member: str, data: bytes, tmp_path: Path) -> bytes:
    return torch_wheel(tmp_path, **{member: data})


@pytest.mark.parametrize("answer", ["text/plain page", "files not a list", "nested page", "truncated page",
                                    "metadata not utf-8", "bad requirement", "bad version.py", "not a zip",
                                    "corrupt deflate", "file url not http", "html page"])
def test_what_the_libraries_raise_on_a_hostile_answer_is_one_line_exit_2(tmp_path, compat, answer):
    data = torch_wheel(tmp_path)
    with Peer() as peer:
        url = serve_torch(peer, data)
        if answer == "text/plain page":
            peer.routes["/simple/torch/"] = lambda handler: send(handler, 200, b"hello", "text/plain")
        elif answer == "files not a list":
            peer.routes["/simple/torch/"] = lambda handler: send(
                handler, 200, b'{"meta": {"api-version": "1.1"}, "name": "torch", "files": 5}', JSON_TYPE)
        elif answer == "nested page":
            peer.routes["/simple/torch/"] = lambda handler: send(handler, 200, b"[" * 100000, JSON_TYPE)
        elif answer == "truncated page":
            peer.routes["/simple/torch/"] = truncated(b'{"meta": {"api-version": "1.1"}, "na')
        elif answer == "metadata not utf-8":
            serve_torch(peer, wheel_with("metadata", b"Name: torch\nRequires-Python: >=3.11\n\xff\xfe\n", tmp_path))
        elif answer == "bad requirement":
            serve_torch(peer, wheel_with("metadata", b"Name: torch\nRequires-Dist: nvidia-cudnn-cu13 ((\n", tmp_path))
        elif answer == "bad version.py":
            serve_torch(peer, wheel_with("version_py_text", b"__version__ = 'not a version!'\n", tmp_path))
        elif answer == "not a zip":
            serve_torch(peer, b"PK\x05\x06" + os.urandom(4096))
        elif answer == "corrupt deflate":
            serve_torch(peer, corrupt_deflate(data))
        elif answer == "html page":  # PEP 503: the digest in the link's fragment
            link = f"<a href='{peer.url}/files/{TORCH_WHEEL}#sha256=ZZ%0A%3A%3Aerror%3A%3Ax'>{TORCH_WHEEL}</a>"
            peer.routes["/simple/torch/"] = lambda handler: send(handler, 200, f"<html>{link}</html>".encode(),
                                                                 "text/html")
        else:
            peer.routes["/simple/torch/"] = project_page([{**file_entry(peer, TORCH_WHEEL, data),
                                                                 "url": "file:///etc/passwd"}])
        result = refresh(compat, "2.16.0", "--index-url", url)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_metadata_listing_thousands_of_requirements_is_refused_before_they_are_parsed(tmp_path, compat):
    """One METADATA of 600,000 Requires-Dist lines cost seconds per wheel (issue 45, earlier rounds' leftovers): past
    a thousand (torch names a few dozen) the wheel is refused in one line, before any is parsed."""
    metadata = b"Name: torch\nRequires-Python: >=3.11\n" + b"Requires-Dist: numpy\n" * 5000
    with Peer() as peer:
        url = serve_torch(peer, wheel_with("metadata", metadata, tmp_path))
        result = refresh(compat, "2.16.0", "--index-url", url)
    assert result.returncode == 2 and "it lists 5000 requirements" in result.stderr, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def truncated(body: bytes) -> Callable:
    """An answer that announces more than it sends, then closes the connection."""
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", JSON_TYPE)
        handler.send_header("Content-Length", str(len(body) * 10))
        handler.end_headers()
        handler.wfile.write(body)
        handler.close_connection = True
    return answer


def corrupt_deflate(data: bytes) -> bytes:
    """The wheel with METADATA's compressed bytes overwritten: zlib's own error when it is read."""
    with zipfile.ZipFile(io.BytesIO(data)) as wheel:
        info = next(info for info in wheel.infolist() if info.filename.endswith("METADATA"))
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    return data[:start] + b"\xff" * info.compress_size + data[start + info.compress_size:]


# ---------------------------------------------------------------------------------------------------- bounds

def test_a_page_that_drips_forever_ends_at_the_commands_bound(compat, monkeypatch):
    """Each byte comes within the per-read timeout, so only a bound on the whole command ends it."""
    monkeypatch.setattr(index_http, "TIMEOUT_S", 1.0)
    monkeypatch.setattr(index_http, "COMMAND_TIME_S", 2.0)
    with Peer() as peer:
        def drip(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(200)
            handler.send_header("Content-Type", JSON_TYPE)
            handler.send_header("Content-Length", str(1 << 30))
            handler.end_headers()
            for _ in range(600):  # 60 s at most: the test cannot hang when the bound fails
                if peer.stop.is_set():
                    return
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.1)
        peer.routes["/simple/torch/"] = drip
        result = refresh(compat, "2.16.0", "--index-url", peer.url + "/simple")
    assert result.returncode == 2 and "timed out" in result.stderr and "in all" in result.stderr


def test_a_206_that_is_not_the_range_asked_for_is_refused(tmp_path, compat):
    data = torch_wheel(tmp_path)
    with Peer() as peer:
        url = serve_torch(peer, data)
        peer.routes[f"/files/{TORCH_WHEEL}"] = lambda handler: send(
            handler, 206, data[:4096], headers={"Content-Range": f"bytes 0-4095/{len(data)}"})
        result = refresh(compat, "2.16.0", "--index-url", url)
    assert result.returncode == 2 and "not that range" in result.stderr


def test_bytes_are_bounded_for_the_command_not_only_per_answer(tmp_path, compat, monkeypatch):
    monkeypatch.setattr(index_http, "COMMAND_BYTES", 4096)
    with LocalIndex(make_release(tmp_path / "index", cuda_library_size=1024)) as index:
        result = refresh(compat, "2.16.0", "--index-url", index.url)
    assert result.returncode == 2 and "in all" in result.stderr


def test_many_members_under_the_member_bound_are_bounded_in_total(tmp_path, compat, monkeypatch):
    monkeypatch.setattr(package_index, "MAX_WHEEL_READ_BYTES", 1 << 16)
    path = make_wheel(tmp_path / "made", "torch", "2.16.0", PINS, ">=3.11", files={
        **{f"x{n}.dist-info/METADATA": b"Requires-Python: >=3.11\n" + b"#" * 20000 for n in range(8)},
        "torch/version.py": version_py("2.16.0+cu132", "13.2")})
    with Peer() as peer:
        result = refresh(compat, "2.16.0", "--index-url", serve_torch(peer, path.read_bytes()))
    assert result.returncode == 2 and "add up to more" in result.stderr


@pytest.mark.parametrize("script", ["yes 'NVIDIA H100, 9.0, 580.95.05'",
                                    ("i=0; while [ $i -lt 20000 ]; do echo 'NVIDIA H100, 9.0, 580.95.05'; "
                                    "i=$((i+1)); done"),
                                    "sleep 30",
                                    "printf 'NVIDIA \\033[2J::error::x, 9.0, 580.95.05\\n'"])
def test_an_nvidia_smi_that_floods_hangs_or_lies_is_one_bounded_finding(tmp_path, monkeypatch, script):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(doctor, "NVIDIA_SMI_TIMEOUT_S", 2)
    found = doctor.host_gpus()
    assert isinstance(found, str), found
    assert "\x1b" not in found and "\n" not in found and len(found) < 1000


# ------------------------------------------------------------------------------------------------ the property

PAGE_VALUES = st.one_of(st.text(max_size=80), st.integers(), st.none(), st.booleans(), st.lists(st.text(max_size=5)),
                        st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3))


@st.composite
def hostile_page_and_wheel(draw) -> tuple[dict, bytes]:
    """A torch page and wheel as a hostile index serves them: entries' values replaced, keys dropped, the wheel cut,
    flipped or with hostile METADATA and version.py text."""
    entry = {"filename": TORCH_WHEEL, "hashes": {"sha256": "0" * 64}, "upload-time": "2026-11-20T10:00:00Z"}
    for key in draw(st.lists(st.sampled_from(["filename", "hashes", "upload-time", "yanked", "size"]), max_size=3)):
        entry[key] = draw(PAGE_VALUES)
    if draw(st.booleans()):
        entry["hashes"] = {"sha256": draw(st.sampled_from([INJECTION, "A" * 64, "f" * 64, "\uff10" * 64]))}
    text = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
    version_text = draw(st.one_of(st.none(), text.map(lambda t: f"__version__ = '{t}'\ncuda = '{t}'\n".encode())))
    metadata = draw(st.one_of(st.none(), st.binary(max_size=200),
                              text.map(lambda t: f"Requires-Python: {t}\nRequires-Dist: {t}\n".encode())))
    cut = draw(st.sampled_from([None, 22, 100, 1000]))
    return entry, (version_text, metadata, cut)


@pytest.fixture(scope="module")
def hostile_peer():
    with Peer() as peer:
        yield peer


@settings(max_examples=60, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=hostile_page_and_wheel())
def test_the_index_reader_gives_facts_of_their_shape_or_an_input_error(hostile_peer, tmp_path_factory, case):
    """Whatever the page and the wheel hold: `read_release` returns facts whose every value has its shape, or
    raises InputError; nothing else escapes."""
    entry, (version_text, metadata, cut) = case
    data = torch_wheel(tmp_path_factory.mktemp("wheel"), version_py_text=version_text, metadata=metadata)
    data = data[:cut] if cut else data
    entry = {**entry, "url": f"{hostile_peer.url}/files/{TORCH_WHEEL}"}
    if entry.get("hashes") == {"sha256": "0" * 64}:
        entry["hashes"] = {"sha256": hashlib.sha256(data).hexdigest()}
    hostile_peer.routes["/simple/torch/"] = lambda handler: send(
        handler, 200, json.dumps({"meta": {"api-version": "1.1"}, "name": "torch", "files": [entry]}).encode(),
        JSON_TYPE)
    hostile_peer.routes[f"/files/{TORCH_WHEEL}"] = ranges_of(data)
    try:
        release = compat_refresh.read_release(package_index.Index(hostile_peer.url + "/simple"), "2.16.0")
    except InputError as error:
        assert all("\n" not in str(problem) and "\x1b" not in str(problem) for problem in error.problems)
        return
    for build in release.builds if release else ():
        assert re.fullmatch(r"[0-9a-f]{64}", build.source.sha256)
        assert re.fullmatch(r"[A-Za-z0-9._+!-]+\.whl", build.source.file)
        assert build.cuda is None or re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,2}", build.cuda)
        assert re.fullmatch(r"[a-z0-9]+", build.build)
        assert all(re.fullmatch(r"[0-9][0-9.a-z]*", value) for value in build.pins.values())
        assert re.fullmatch(r"[0-9a-z.,~=<>!*+]*", build.triton)
        assert build.python_min == "" or re.fullmatch(r"[0-9]+\.[0-9]+", build.python_min)


def test_a_release_whose_wheel_pins_no_cudnn_is_a_note_not_a_traceback(fixture_project, tmp_path):
    """A wheel without the pins compat.yaml keeps (a hostile or broken build): the watch proposes no row for it."""
    folder = make_release(tmp_path / "index", cuda_library_size=1024)
    make_wheel(folder, "torch", "2.16.0", tuple(pin for pin in PINS if "cudnn" not in pin), ">=3.11", files={
        "torch/version.py": version_py("2.16.0+cu132", "13.2"), "torch/lib/libtorch_python.so": ARCH_FLAGS})
    with LocalIndex(folder) as index:
        result = run_cli_in_process("--matrix", str(fixture_project / "matrix.yaml"), "--images",
                                    str(fixture_project / "images"), "--reports", str(fixture_project / "reports"),
                                    "watch", "--index-url", index.url)
    assert_contract(result)


# ----------------------------------------------------------- an index URL (issue 45's fifth round: a leftover)

def test_an_ipv6_index_url_without_its_bracket_is_exit_2(tmp_path):
    from .conftest import copy_fixture_project, run_cli_in_process
    matrix = copy_fixture_project(tmp_path / "project")
    refused = run_cli_in_process("--matrix", str(matrix), "compat", "refresh", "2.16.0", "--index-url", "http://[::1")
    assert refused.returncode == 2 and "--index-url" in refused.stderr and "Traceback" not in refused.stderr
