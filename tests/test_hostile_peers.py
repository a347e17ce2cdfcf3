"""Peers that stall, lie or leak (issue 18; docs/hostile-input.md, "Peers"): the Docker engine, registries and pip
are peers of the tool, and each may never answer, answer garbage, or repeat a credential in an error.

The peers here are real servers on this machine: a registry that accepts connections and says nothing (a TCP socket
on 127.0.0.1), a registry that answers what a test tells it (an HTTP server on 127.0.0.1, which skopeo talks to as it
would to any registry), and a Docker engine that answers what a test tells it (an HTTP server on a unix socket,
which docker-py talks to as it would to dockerd). No traffic leaves the machine. Bounds are cut to fractions of a
second here (the product's are seconds for a question, half an hour for a transfer: the same code paths), so
everything runs in `make test-fast`; property tests run a handful of derandomized examples each.
"""
from __future__ import annotations

import ast
import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import socketserver
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock
from urllib.parse import quote, quote_plus, urlencode

import docker
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from torchimages.build import wheels
from torchimages.build.builder import BUILD_REPORT
from torchimages.build.lock import Resolver, UnresolvedBase
from torchimages.matrix.load import load_matrix
from torchimages.model import InputError, PeerError, parse_size
from torchimages.peers import engine
from torchimages.peers.registry import Manifest, RegistryClient, RegistryError, RetryPolicy, with_retries
from torchimages.peers.registry_access import registry_access
from torchimages.peers.registry_address import image_registry, parse_registry
from torchimages.publish.catalog import Catalog, CatalogEntry, PinnedTag
from torchimages.publish.prune import prune_lookups
from torchimages.redaction import Secrets
from torchimages.trust.bundles import referrers_tag
from torchimages.trust.signatures import attestation_tag, signature_tag

from .conftest import FIXTURE_MATRIX, ROOT
from .hostile_fixtures import CPU_RUNTIME, assert_contract, in_scratch, make_scratch, run_bounded

BOUND_S = 0.5  # the question bound in these tests
CUT_BOUNDS = (mock.patch("torchimages.peers.registry.QUESTION_TIMEOUT_S", BOUND_S),
              mock.patch("torchimages.peers.engine.QUESTION_TIMEOUT_S", BOUND_S))
PASSWORD, PROXY_PASSWORD = "S3cret-Pass/word@1", "Pr0xy-Pass"
DIGEST = "sha256:" + "a" * 64
PEER_SETTINGS = settings(max_examples=6, deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture
def bounds_cut():
    with CUT_BOUNDS[0], CUT_BOUNDS[1]:
        yield


def short_folder() -> Path:
    """A folder for unix sockets, whose paths must stay under 108 bytes."""
    return Path(tempfile.mkdtemp(prefix="ti-", dir="/tmp"))


# ------------------------------------------------------------------------------------------------------ the peers

class SilentRegistry:
    """A TCP port on 127.0.0.1 that accepts connections and never answers: a wedged registry."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.server.accept()[0])
            except OSError:  # closed
                return

    def close(self):
        self.server.close()
        for connection in self.held:
            connection.close()


@pytest.fixture
def silent_registry():
    peer = SilentRegistry()
    yield peer
    peer.close()


class FakeRegistry:
    """A registry API on 127.0.0.1 answering what `manifests` (reference -> body) and `tag_list` say; it counts the
    manifest requests. A body that is a valid manifest is also served by its digest, as registries do."""

    def __init__(self, repository: str = "ml/pytorch"):
        self.repository = repository
        self.manifests: dict[str, bytes] = {}
        self.tag_list: bytes | None = None
        self.manifest_requests: list[str] = []
        self.deleted: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes = b"", kind: str = "application/json"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.end_headers()
                if self.command != "HEAD":
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client stopped reading at its bound
                        self.wfile.write(body)

            def do_GET(self):
                prefix = f"/v2/{fake.repository}/"
                if self.path == "/v2/":
                    return self._send(200, b"{}")
                if self.path.startswith(prefix + "tags/list"):
                    tags = sorted(name for name in fake.manifests if not name.startswith("sha256:"))
                    return self._send(200, fake.tag_list or json.dumps({"name": fake.repository, "tags": tags}).encode())
                if self.path.startswith(prefix + "manifests/"):
                    reference = self.path.removeprefix(prefix + "manifests/")
                    fake.manifest_requests.append(reference)
                    body = fake.by_reference().get(reference)
                    if body is None:
                        return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}')
                    return self._send(200, body, "application/vnd.docker.distribution.manifest.v2+json")
                return self._send(404, b"{}")

            do_HEAD = do_GET

            def do_DELETE(self):
                fake.deleted.append(self.path.rsplit("/", 1)[-1])
                self._send(202)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def by_reference(self) -> dict[str, bytes]:
        return {**self.manifests, **{"sha256:" + hashlib.sha256(body).hexdigest(): body for body in self.manifests.values()}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_registry():
    peer = FakeRegistry()
    yield peer
    peer.close()


def manifest_body(tag: str) -> bytes:
    config = "sha256:" + hashlib.sha256(tag.encode()).hexdigest()
    return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 10,
                                  "digest": config}, "layers": []}).encode()


STALL = object()


class FakeEngine:
    """A Docker engine API on a unix socket: it answers the ping, and every other request as `answer(method, path)`
    says: (status, JSON-able or bytes body), or STALL to accept and never answer. The API version prefix is cut off
    the path. Request bodies (a build's context) are read in full."""

    def __init__(self, answer):
        self.path = short_folder() / "docker.sock"
        self.stalled = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def address_string(self):
                return "fake-engine"

            def log_message(self, *args):
                pass

            def handle_one(self):
                self._read_body()
                path = re.sub(r"^/v[0-9.]+", "", self.path.split("?")[0])
                if path == "/_ping":
                    return self._send(200, b"OK", "text/plain")
                if path == "/version":
                    return self._send(200, json.dumps({"ApiVersion": "1.41", "Version": "20.10"}).encode())
                status, body = answer(self.command, path)
                if status is STALL:
                    fake.stalled.wait()
                    return None
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                return self._send(status, data)

            do_GET = do_POST = do_HEAD = do_DELETE = handle_one

            def _read_body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    while (size := int(self.rfile.readline().strip() or b"0", 16)) > 0:
                        self.rfile.read(size + 2)
                    self.rfile.readline()
                else:
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _send(self, status: int, body: bytes, kind: str = "application/json"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Api-Version", "1.41")
                self.end_headers()
                self.wfile.write(body)

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(str(self.path), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": f"unix://{self.path}"}

    def client(self) -> docker.DockerClient:
        with mock.patch.dict(os.environ, self.env):
            return engine.client()

    def close(self):
        self.stalled.set()
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.path.parent)


def an_image(**changes) -> dict:
    return {"Id": "sha256:" + "b" * 64, "Size": 1000, "Config": {"Labels": None}, "RepoTags": ["x:1"],
            "RepoDigests": [], **changes}


def engine_answering(info=None, image=None, build=None):
    """An engine whose /info, image inspects and /build answer as given ((status, body) or STALL); images the tool
    itself names (localhost:5000/...) are missing, any other (a base) exists."""
    def answer(method: str, path: str):
        if path == "/info":
            return info or (200, {"ServerVersion": "20.10", "Runtimes": {}})
        if path.startswith("/images/") and path.endswith("/json"):
            if "localhost%3A5000" in path or "localhost:5000" in path:
                return 404, {"message": "No such image"}
            return image or (200, an_image())
        if path == "/build":
            return build or (500, {"message": "no builds here"})
        return 404, {"message": f"page not found: {path}"}
    return answer


@pytest.fixture
def make_engine():
    made = []

    def make(answer) -> FakeEngine:
        made.append(FakeEngine(answer))
        return made[-1]
    yield make
    for fake in made:
        fake.close()


# -------------------------------------------------------------------------------------------------- scratch space

def catalog_for(scratch: Path, host: str) -> Path:
    """A one-row catalog whose row is published at host/ml/pytorch (catalog/ beside the scratch images folder)."""
    folder = scratch / "catalog"
    (folder / "sbom").mkdir(parents=True)
    pinned = f"{CPU_RUNTIME}-20260102"
    sbom = f"sbom/{pinned}.cdx.json"
    (folder / sbom).write_text("{}")
    entry = CatalogEntry(CPU_RUNTIME, f"{host}/ml/pytorch", DIGEST, "sha256:" + "c" * 64,
                         [PinnedTag(pinned, DIGEST, "2026-01-02", sbom)], [CPU_RUNTIME],
                         {"torch": "2.13.0", "cuda": "cpu", "python": "3.11", "os": "debian12"}, 1000, 500,
                         {"passed": 1}, {"status": "skipped"}, sbom, "2026-01-02T00:00:00Z", "2026-01-02T00:00:00Z")
    (folder / "catalog.json").write_text(json.dumps(Catalog({CPU_RUNTIME: entry}).to_json()))
    return folder


@pytest.fixture
def scratch(tmp_path) -> Path:
    folder = make_scratch(tmp_path)
    (folder / "docker").mkdir()  # an empty Docker config folder: anonymous access
    return folder


def run_in(scratch: Path, *command: str, env: dict | None = None):
    return run_bounded(*in_scratch(scratch, *command), env={"DOCKER_CONFIG": str(scratch / "docker"), **(env or {})})


def assert_names_the_peer(result, *words: str) -> None:
    """Exit 1, no traceback, and one line saying which peer and what happened."""
    assert_contract(result, 1)
    text = result.stdout + result.stderr
    for word in words:
        assert word in text, text


# ------------------------------------------------------------------------------------ 1. credentials in error text

def spellings(secret: str) -> set[str]:
    escaped = json.dumps(secret)[1:-1]
    return {secret, quote(secret, safe=""), quote_plus(secret), quote_plus(escaped), escaped, repr(secret)[1:-1]}


def assert_no_secret(text: str, *secrets: str) -> None:
    for secret in secrets:
        for form in spellings(secret):
            assert form not in text, f"{form!r} in:\n{text[:3000]}"


BUILD_ANSWERS = {
    # docker-py's HTTP error repeats the request URL, whose buildargs carry the index URL and proxy logins
    "http-error": (500, {"message": "failed to dial gRPC: no builder"}),
    # the engine's build stream says what pip said, login and all
    "stream-error": (200, {"error": f"pip: 401 from https://alice:{PASSWORD}@index.example/simple via "
                                    f"http://p:{PROXY_PASSWORD}@proxy"}),
}


@pytest.mark.parametrize("case", sorted(BUILD_ANSWERS))
def test_build_errors_keep_credentials_out_of_stderr_reports_and_logs(scratch, make_engine, case):
    fake = make_engine(engine_answering(build=BUILD_ANSWERS[case]))
    assert_contract(run_in(scratch, "render"), 0)
    index = f"https://alice:{quote(PASSWORD, safe='')}@index.example/simple"
    result = run_in(scratch, "build", CPU_RUNTIME, "--pip-index-url", index,
                    env={**fake.env, "HTTPS_PROXY": f"http://p:{PROXY_PASSWORD}@proxy.example:3128"})
    assert_contract(result, 1)
    report = (scratch / "reports" / BUILD_REPORT.name).read_text()
    log = (scratch / "reports" / CPU_RUNTIME / "build.log").read_text()
    assert "failed" in report and "<redacted>" in result.stderr + report
    assert_no_secret(result.stdout + result.stderr + report + log, PASSWORD, quote(PASSWORD, safe=""), PROXY_PASSWORD)


def test_registry_messages_never_show_the_docker_configs_login(scratch, fake_registry):
    """skopeo's error quotes the URL it used: the login from config.json is taken out (a wrong-shaped answer here)."""
    fake_registry.manifests[CPU_RUNTIME] = f"not JSON: https://ci:{PASSWORD}@{fake_registry.host}".encode()
    auth = base64.b64encode(f"ci:{PASSWORD}".encode()).decode()
    (scratch / "docker" / "config.json").write_text(json.dumps({"auths": {fake_registry.host: {"auth": auth}}}))
    catalog_for(scratch, fake_registry.host)
    result = run_in(scratch, "catalog", "--check-registry")
    assert_names_the_peer(result, fake_registry.host, "not JSON")
    assert_no_secret(result.stdout + result.stderr, PASSWORD, auth)


class RefusingIndex:
    """A package index on 127.0.0.1 that refuses every request, as an index does a wrong login."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def refusing_index():
    peer = RefusingIndex()
    yield peer
    peer.close()


@pytest.mark.parametrize("command", ["wheels", "images"])
def test_a_failed_wheel_fetch_is_one_line_without_the_index_or_proxy_login(scratch, make_engine, refusing_index,
                                                                           command):
    """pip's failure was a traceback in `images --wheelhouse` (only `wheels` caught it); neither shows a login."""
    fake = make_engine(engine_answering())
    index = f"http://alice:{quote(PASSWORD, safe='')}@{refusing_index.host}/simple"
    flag = "--dest" if command == "wheels" else "--wheelhouse"
    # One retry of the refused proxy, not pip's five with their 7.75 s of back-off: the messages are the same.
    pip_alone = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(scratch / "no-wheels"), "NO_PROXY": "127.0.0.1",
                 "HTTPS_PROXY": f"http://p:{PROXY_PASSWORD}@127.0.0.1:9", "PIP_RETRIES": "1", **fake.env}
    result = run_in(scratch, command, CPU_RUNTIME, flag, str(scratch / "wheelhouse"), "--pip-index-url", index,
                    env=pip_alone)
    assert_names_the_peer(result, "pip could not fetch the wheels")
    assert_no_secret(result.stdout + result.stderr, PASSWORD, quote(PASSWORD, safe=""), PROXY_PASSWORD)


class TricklingIndex:
    """A package index on 127.0.0.1 that answers every page a byte at a time: never silent for pip's socket timeout,
    never done."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(10**9))
                self.end_headers()
                with contextlib.suppress(OSError):  # pip was killed
                    while not stopped.wait(0.2):
                        self.wfile.write(b" ")
                        self.wfile.flush()

        stopped = self.stopped = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://alice:{quote(PASSWORD, safe='')}@127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_wheel_fetch_from_an_index_that_trickles_ends_at_its_bound(tmp_path, monkeypatch):
    """pip's socket timeout bounds silence only: an index sending a byte now and then held `wheels` for ever."""
    index = TricklingIndex()
    monkeypatch.setattr(wheels, "FETCH_BOUND_S", 3)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # where a killed pip would leave its own folders
    spec = next(spec for spec in load_matrix(FIXTURE_MATRIX).specs if spec.tag == CPU_RUNTIME)
    try:
        with pytest.raises(PeerError, match="within 3 s") as raised:
            wheels.fetch_wheels([spec], tmp_path / "wheelhouse", index_url=index.url, extra_index_url=index.url)
    finally:
        index.close()
    assert_no_secret(str(raised.value), PASSWORD, quote(PASSWORD, safe=""))
    assert not list((tmp_path / "wheelhouse").rglob("*.whl"))
    assert not list((tmp_path / "tmp").iterdir()) and not list((tmp_path / "wheelhouse").rglob(".*")), \
        "the killed pip's temporary folders were left"


def test_no_output_shows_a_login_given_in_the_registry_flag(scratch):
    """A login before --registry's host is quoted back by the message that refuses it: the output streams take it
    out, as they take out every login the run's flags and environment name."""
    result = run_in(scratch, "prune", "--retention", "2", "--registry", f"ci:{PASSWORD}@127.0.0.1:5999/ml/pytorch")
    assert_contract(result, 2)
    assert "--registry" in result.stderr and "<redacted>" in result.stderr
    assert_no_secret(result.stdout + result.stderr, PASSWORD)


def test_an_engine_error_escaping_a_stage_shows_no_login(scratch):
    """docker-py's HTTP errors are OSErrors repeating the request URL (the build args in it): the one that escapes a
    stage reaches main()'s boundary, whose output streams redact the run's logins in every spelling."""
    index = f"https://alice:{quote(PASSWORD, safe='')}@index.example/simple"
    url = "http+docker://localhost/v1.41/build?" + urlencode({"buildargs": json.dumps({"PIP_INDEX_URL": index})})
    escaping = docker.errors.APIError(f"500 Server Error for {url}")
    assert isinstance(escaping, OSError)
    with mock.patch("torchimages.cli.images.run_builds", side_effect=escaping):
        result = run_in(scratch, "build", CPU_RUNTIME, "--pip-index-url", index)
    assert_contract(result, 1)
    assert "500 Server Error" in result.stderr
    assert_no_secret(result.stdout + result.stderr, PASSWORD, quote(PASSWORD, safe=""))


# --------------------------------------------------------------------- 3. files handed to a peer are regular files

def not_regular(kind: str, path: Path) -> Path:
    if kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["link to /dev/zero", "FIFO"])
def test_certs_d_files_and_the_registry_ca_must_be_bounded_regular_files(scratch, kind):
    host = "127.0.0.1:5999"  # never contacted: the files are refused first
    catalog_for(scratch, host)
    certs_d = scratch / "certs.d"
    (certs_d / host).mkdir(parents=True)
    ca = not_regular(kind, certs_d / host / "ca.crt")
    result = run_in(scratch, "catalog", "--check-registry", "--certs-d", str(certs_d))
    assert_contract(result, 2)
    assert str(ca) in result.stderr and "not a regular file" in result.stderr
    given_ca = not_regular(kind, scratch / "given-ca.pem")
    result = run_in(scratch, "catalog", "--check-registry", "--certs-d", str(scratch / "none"),
                    "--registry-ca", str(given_ca))
    assert_contract(result, 2)
    assert str(given_ca) in result.stderr


@pytest.mark.parametrize("kind", ["link to /dev/zero", "FIFO"])
def test_the_builds_ca_bundle_must_be_a_bounded_regular_file(scratch, kind):
    bundle = not_regular(kind, scratch / "bundle.pem")
    result = run_in(scratch, "build", CPU_RUNTIME, "--ca-bundle", str(bundle))
    assert_contract(result, 2)
    assert str(bundle) in result.stderr


def test_skopeo_reads_copies_of_what_was_checked(tmp_path):
    """The auth file and CA folder skopeo is given are copies made here, not the user's files (which could change
    into a FIFO between the check and skopeo's read)."""
    certs_d = tmp_path / "certs.d"
    (certs_d / "reg.example:443").mkdir(parents=True)
    (certs_d / "reg.example:443" / "ca.crt").write_text("PEM")
    (tmp_path / "config.json").write_text(json.dumps({"auths": {}}))
    access = registry_access(parse_registry("reg.example:443/x"), config_dir=tmp_path, certs_d=certs_d)
    assert access.auth_file.parent == access.cert_dir.parent == Path(access.scratch.name)
    assert (access.cert_dir / "ca.crt").read_text() == "PEM" and access.tls_verify


# ------------------------------------------------------------------------------------ 4. peers that never answer

def test_catalog_check_names_a_registry_that_never_answers(scratch, silent_registry, bounds_cut):
    catalog_for(scratch, silent_registry.host)
    result = run_in(scratch, "catalog", "--check-registry")
    assert_names_the_peer(result, silent_registry.host, f"did not answer within {BOUND_S:g} s")


def test_prune_names_a_registry_that_never_answers(scratch, silent_registry, bounds_cut):
    catalog_for(scratch, silent_registry.host)
    result = run_in(scratch, "prune", CPU_RUNTIME, "--retention", "1", "--retries", "0",
                    "--registry", f"{silent_registry.host}/ml/pytorch")
    assert_names_the_peer(result, silent_registry.host, "did not answer")


def test_publish_names_a_registry_that_never_answers(scratch, silent_registry, make_engine, bounds_cut):
    fake = make_engine(engine_answering())
    result = run_in(scratch, "publish", CPU_RUNTIME, "--retries", "0", "--registry",
                    f"{silent_registry.host}/ml/pytorch", env=fake.env)
    assert_names_the_peer(result, silent_registry.host, "nothing published", "did not answer")


def test_lock_names_a_registry_that_never_answers(silent_registry, make_engine, tmp_path, bounds_cut):
    fake = make_engine(engine_answering(image=(404, {"message": "No such image"})))
    resolver = Resolver(fake.client(), pull=False, access=lambda r: registry_access(r, config_dir=tmp_path))
    with pytest.raises(UnresolvedBase, match=re.escape(silent_registry.host) + ".*did not answer"):
        resolver.resolve(f"{silent_registry.host}/base/os:1")


def test_an_engine_describing_an_image_without_id_is_named_when_verifying(scratch, make_engine):
    """An engine that answers an image's inspect without its Id was a KeyError traceback in `build.py test` (issue 45,
    earlier rounds' leftovers): the image is checked for its shape, as every other inspect is."""
    fake = make_engine(engine_answering(image=(200, {"Size": 1, "Config": {"Labels": {}}})))
    result = run_in(scratch, "test", CPU_RUNTIME, "--image", "some/image:1", env=fake.env)
    assert_names_the_peer(result, str(fake.path), "described image 'some/image:1' with no Id")


def test_engine_info_that_stalls_after_a_good_ping_is_named(scratch, make_engine, bounds_cut):
    fake = make_engine(engine_answering(info=(STALL, None)))
    result = run_in(scratch, "doctor", CPU_RUNTIME, "--pip-index-url", "http://127.0.0.1:9/simple/",
                    "--extra-index-url", "http://127.0.0.1:9/simple/", env=fake.env)
    assert_names_the_peer(result, str(fake.path), "did not answer GET /info", "within 0.5 s")


def test_an_engine_silent_during_a_build_fails_it_naming_the_engine(scratch, make_engine):
    """docker-py's build() passes its own timeout (None) over the client's: a dockerd wedged mid-build hung `build`
    for ever. Silence past the bound fails that build, naming the engine; the run ends."""
    fake = make_engine(engine_answering(build=(STALL, None)))
    assert_contract(run_in(scratch, "render"), 0)
    with mock.patch("torchimages.build.builder.BUILD_SILENCE_S", BOUND_S):
        result = run_in(scratch, "build", CPU_RUNTIME, env=fake.env)
    assert_names_the_peer(result, str(fake.path), "sent nothing")
    assert "sent nothing" in (scratch / "reports" / BUILD_REPORT.name).read_text()


def test_retries_stop_at_their_total_bound():
    attempts = []

    def failing():
        attempts.append(1)
        raise RegistryError("registry r does not answer: connection refused", transient=True)

    with pytest.raises(RegistryError):
        with_retries(failing, RetryPolicy(retries=50, first_delay_s=0.1, total_s=0.25), lambda message, delay: None)
    assert 1 < len(attempts) < 10  # stopped by the total bound, long before 51 tries


# ------------------------------------------------------------------------------------ 5. peers answering garbage

MANIFEST_GARBAGE = {
    "not JSON": b"<html>proxy login page</html>",
    "a JSON list, not an object": b"[1, 2]",
    "without a manifest's mediaType, config and layers": b'{"config": "sha256:x", "layers": 5}',
}


@pytest.mark.parametrize("body", sorted(MANIFEST_GARBAGE))
def test_registry_manifests_of_the_wrong_shape_name_the_registry(scratch, fake_registry, body):
    fake_registry.manifests[CPU_RUNTIME] = MANIFEST_GARBAGE[body]
    catalog_for(scratch, fake_registry.host)
    result = run_in(scratch, "catalog", "--check-registry")
    assert_names_the_peer(result, f"registry {fake_registry.host} sent the manifest of {CPU_RUNTIME}", body)


ENGINE_GARBAGE = {
    "a JSON list": (200, [1, 2]),
    "what is not JSON": (200, b"<html>not an engine</html>"),
    "failed": (500, {"message": "daemon is shutting down"}),
}


@pytest.mark.parametrize("said", sorted(ENGINE_GARBAGE))
def test_engine_info_of_the_wrong_shape_names_the_engine(scratch, make_engine, said):
    fake = make_engine(engine_answering(info=ENGINE_GARBAGE[said]))
    result = run_in(scratch, "doctor", CPU_RUNTIME, "--pip-index-url", "http://127.0.0.1:9/simple/",
                    "--extra-index-url", "http://127.0.0.1:9/simple/", env=fake.env)
    assert_names_the_peer(result, str(fake.path), "/info", said)


INFO_FIELDS_OF_THE_WRONG_TYPE = {
    "Runtimes a number": ("images", {"Runtimes": 5}),  # was a traceback choosing the default rows
    "Runtimes text": ("images", {"Runtimes": "nvidia-free"}),  # was every row taken as if the engine had GPUs
    "DiscoveredDevices a number": ("images", {"Runtimes": {}, "CDISpecDirs": ["/etc/cdi"], "DiscoveredDevices": 7}),
    "DockerRootDir a number": ("doctor", {"DockerRootDir": 5}),
}


@pytest.mark.parametrize("case", sorted(INFO_FIELDS_OF_THE_WRONG_TYPE))
def test_engine_info_fields_of_the_wrong_type_name_the_engine(scratch, make_engine, case):
    command, info = INFO_FIELDS_OF_THE_WRONG_TYPE[case]
    fake = make_engine(engine_answering(info=(200, {"ServerVersion": "20.10", **info})))
    local_index = ("--pip-index-url", "http://127.0.0.1:9/simple/") if command == "doctor" else ()  # not a public one
    result = run_in(scratch, command, *local_index, env=fake.env)
    assert_names_the_peer(result, str(fake.path), "/info", case.split()[0])
    assert not (scratch / "reports").exists(), "nothing built on an engine whose answer was not understood"


@pytest.mark.parametrize("image", [an_image(Id=5), an_image(Config=[]), an_image(Size="big"), an_image(RepoTags="x")])
def test_image_inspect_of_the_wrong_shape_names_the_engine(scratch, make_engine, image):
    fake = make_engine(engine_answering(image=(200, image)))
    assert_contract(run_in(scratch, "render"), 0)
    result = run_in(scratch, "build", CPU_RUNTIME, env=fake.env)
    assert_names_the_peer(result, str(fake.path), "described image")


@pytest.mark.parametrize("config, key", [
    ({"auths": {"reg.example": {"auth": 5}}}, "auths['reg.example'].auth must be a string"),
    ({"auths": {"reg.example": "x"}}, "auths['reg.example'] must be an object"),
    ({"auths": []}, "'auths' must be an object"),
    ({"credHelpers": {"reg.example": ["pass"]}}, "credHelpers['reg.example'] must be a helper name"),
    ({"credsStore": 1}, "'credsStore' must be a helper name"),
    ([], "the document must be an object"),
])
def test_a_docker_config_of_the_wrong_shape_is_refused_naming_the_key(scratch, config, key):
    (scratch / "docker" / "config.json").write_text(json.dumps(config))
    catalog_for(scratch, "reg.example")
    result = run_in(scratch, "catalog", "--check-registry")
    assert_contract(result, 2)
    assert str(scratch / "docker" / "config.json") in result.stderr and key in result.stderr


# ------------------------------------------------------------------------- 9. cost follows what was selected

def test_prune_reads_only_the_manifests_that_matter_to_its_rows():
    matrix = load_matrix(FIXTURE_MATRIX).specs
    row, others = matrix[0], matrix[1:]
    dated = [f"{spec.tag}-2026010{day}" for spec in matrix for day in (1, 2, 3)]
    all_tags = sorted(dated + [spec.tag for spec in matrix] + ["hand-pushed"])
    looked_up = prune_lookups([row], matrix, all_tags, retention=1)
    own_dated = [name for name in dated if re.fullmatch(re.escape(row.tag) + "-2026010[123]", name)]
    assert looked_up == sorted([row.tag, *own_dated, "hand-pushed"])
    assert not any(spec.tag in looked_up for spec in others)
    assert prune_lookups([row], matrix, all_tags, retention=3) == []  # nothing past retention: nothing read


def test_prune_of_one_row_asks_the_registry_for_its_tags_only(scratch, fake_registry):
    matrix = load_matrix(scratch / "matrix.yaml").specs
    for spec in matrix:
        for name in (spec.tag, f"{spec.tag}-20260101", f"{spec.tag}-20260102"):
            fake_registry.manifests[name] = manifest_body(name)
    catalog_for(scratch, fake_registry.host)
    result = run_in(scratch, "prune", CPU_RUNTIME, "--retention", "1", "--registry", f"{fake_registry.host}/ml/pytorch")
    assert_contract(result, 0)
    pruned = "sha256:" + hashlib.sha256(manifest_body(f"{CPU_RUNTIME}-20260101")).hexdigest()
    # The row's tags, and the signature and attestation tags and the referrers index of the digest it prunes (removed
    # with it): no other row's.
    assert {request for request in fake_registry.manifest_requests if not request.startswith("sha256:")} <= {
        CPU_RUNTIME, f"{CPU_RUNTIME}-20260101", f"{CPU_RUNTIME}-20260102", signature_tag(pruned),
        attestation_tag(pruned), referrers_tag(pruned)}
    assert fake_registry.deleted == [pruned]


def test_unmatched_selectors_are_one_line_each_naming_at_most_the_nearest_tag(scratch):
    """Output follows what was asked, not the matrix's size: a line per selector, with its did-you-mean and how to
    list the tags, never the whole list."""
    selectors = [f"nothing-{n}" for n in range(300)]
    result = run_in(scratch, "list", *selectors)
    assert_contract(result, 2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == len(selectors) and all(len(line) < 300 and "list` prints the" in line for line in lines)
    assert all(f"'{selector}' matches no tag" in result.stderr for selector in selectors)


# ---------------------------------------------------------------------------------- 12. look-alike characters

@pytest.mark.parametrize("text", ["127.0.0.1:\uff15\uff10\uff10\uff10/ml/pytorch", "reg.example:\u0665\u0660/ml/x"])
def test_a_registry_port_in_other_digits_is_refused(text):
    with pytest.raises(InputError):
        parse_registry(text)


@pytest.mark.parametrize("text", ["8\u212a", "8\u212ab", "\uff18g", "\u0668m"])
def test_sizes_in_look_alike_characters_are_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("flags", [("--date", "\uff12\uff10\uff12\uff16\uff10\uff11\uff10\uff12"), ("--gpus", "\uff11")])
def test_flags_in_look_alike_digits_are_refused(scratch, flags):
    command = ("publish", "--registry", "127.0.0.1:5999/ml/pytorch") if flags[0] == "--date" else ("test",)
    result = run_in(scratch, *command, *flags)
    assert_contract(result, 2)
    assert flags[0] in result.stderr


FULL_WIDTH_3 = "\uff13"
INTEGER_FLAGS = {
    "--shards": ("plan", "--shards", FULL_WIDTH_3),
    "--retention": ("prune", "--retention", FULL_WIDTH_3, "--registry", "127.0.0.1:5999/ml/pytorch"),
    "--jobs": ("build", "--jobs", "\u0663"),  # Arabic-Indic three
    "--retries": ("publish", "--retries", FULL_WIDTH_3, "--registry", "127.0.0.1:5999/ml/pytorch"),
    "--timeout": ("test", "--timeout", "1_000"),
}


@pytest.mark.parametrize("flag", sorted(INTEGER_FLAGS))
def test_integer_flags_in_look_alike_digits_are_refused(scratch, flag):
    """argparse's type=int takes whatever int() takes: other scripts' digits, '_' and spaces."""
    result = run_in(scratch, *INTEGER_FLAGS[flag])
    assert_contract(result, 2)
    assert flag in result.stderr and "invalid integer value" in result.stderr


@pytest.mark.parametrize("wait", [FULL_WIDTH_3, "1_0", "inf", "nan", " 3"])
def test_a_lock_wait_in_look_alike_digits_is_refused(scratch, wait):
    result = run_in(scratch, "render", env={"TORCHIMAGES_LOCK_WAIT": wait})
    assert_contract(result, 2)
    assert "TORCHIMAGES_LOCK_WAIT" in result.stderr and not (scratch / "images").exists()


UNICODE_AWARE = re.compile(r"\\\\[dDwWsSbB]|IGNORECASE|re\.I\b")
RE_CALLS = {"compile", "fullmatch", "match", "search", "sub", "subn", "findall", "finditer", "split"}


def test_every_pattern_that_could_match_other_scripts_is_ascii():
    """\\d, \\w, \\s, \\b and IGNORECASE take other scripts' digits, letters and the Kelvin sign unless re.ASCII is
    set; a pattern built at run time must set it too. (The in-image checks, torchimages/checks, read no user input.)"""
    unsafe = []
    for path in sorted((ROOT / "torchimages").rglob("*.py")):
        if "checks" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RE_CALLS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"):
                text = ast.unparse(node)
                literal = isinstance(node.args[0], (ast.Constant, ast.JoinedStr, ast.BinOp))
                if "ASCII" not in text and (not literal or UNICODE_AWARE.search(text)):
                    unsafe.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text[:80]}")
    assert not unsafe, "patterns without re.ASCII:\n" + "\n".join(unsafe)


# ----------------------------------------------------------------------------------------------- property tests

@PEER_SETTINGS
@given(secret=st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=4, max_size=30))
def test_a_known_secret_is_redacted_in_every_spelling_a_peer_repeats(secret):
    url = f"https://user:{secret}@index.example/simple"
    request = "http+docker://localhost/v1.41/build?" + urlencode({"buildargs": json.dumps({"PIP_INDEX_URL": url})})
    said = f"500 Server Error for {request}: {url} {json.dumps(url)} {quote(secret, safe='')} {url!r}"
    assert_no_secret(Secrets.in_urls(url).redact(said), secret)


@PEER_SETTINGS
@given(secret=st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), min_size=8, max_size=120).map(
    lambda text: "pw-" + text))  # a prefix no message holds: a part of the secret shown is found
@example(secret="pw-" + "x" * 80)  # quoted cut short: the part before the cut is no known spelling
@example(secret="pw-it's \"quoted\"")  # repr escapes the quote where JSON does not
def test_no_login_in_flags_reaches_the_output_however_it_is_spelled_or_cut(scratch, secret):
    """--registry quotes its value back, as every flag check does (repr-escaped, cut after 60 characters); a login
    in it, or in --pip-index-url, never shows, not even in part."""
    index = f"https://alice:{quote(secret, safe='')}@index.example/simple"
    result = run_in(scratch, "nightly", "--registry", f"ci:{secret}@127.0.0.1:5999/ml/pytorch", "--pip-index-url",
                    index, "--date", "x")
    assert_contract(result, 2)
    shown = result.stdout + result.stderr
    assert "--registry" in shown and "--date" in shown
    assert_no_secret(shown, secret)
    assert all(form not in shown for form in spellings(secret[:10])), shown  # not even cut short


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(body=st.one_of(st.binary(max_size=200), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["mediaType", "config", "layers", "size", "digest", "x"]), inner, max_size=4),
    max_leaves=12).map(lambda value: json.dumps(value).encode())))
def test_any_bytes_are_a_manifest_or_a_value_error(body):
    try:
        manifest = Manifest.from_body(body)
    except ValueError:
        return
    assert isinstance(manifest.config_digest, str) and isinstance(manifest.download_size, int)


ENGINE_KEYS = st.sampled_from(["Id", "Size", "Config", "Labels", "RepoTags", "RepoDigests", "x"])


def json_containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.lists(inner, max_size=3), st.dictionaries(ENGINE_KEYS, inner, max_size=5))


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8), json_containers,
                           max_leaves=10)


@PEER_SETTINGS
@given(info=JSON_VALUES, image=JSON_VALUES, raw=st.binary(max_size=40))
def test_an_engine_answering_any_shape_is_used_or_named(make_engine, info, image, raw):
    bodies = iter([json.dumps(info).encode(), json.dumps(image).encode(), raw])
    fake = make_engine(lambda method, path: (200, next(bodies, raw)))
    with mock.patch.dict(os.environ, fake.env):  # as in a run: DOCKER_HOST names the engine in messages
        docker_client = engine.client()
        for ask in (lambda: engine.daemon_info(docker_client), lambda: engine.inspect_image(docker_client, "base:1"),
                    lambda: engine.daemon_info(docker_client)):
            try:
                answer = ask()
            except PeerError as error:
                assert str(fake.path) in str(error) and "\n" not in str(error)
                continue
            assert isinstance(answer, dict)
    docker_client.close()


@settings(max_examples=3, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(delay_s=st.sampled_from([0.0, 2 * BOUND_S]))
def test_a_registry_answering_late_is_waited_for_within_the_bound_only(fake_registry, bounds_cut, tmp_path, delay_s):
    fake_registry.manifests["1"] = manifest_body("1")
    late = threading.Event()
    original = fake_registry.by_reference
    fake_registry.by_reference = lambda: (late.wait(delay_s), original())[1]
    address, _ = image_registry(f"{fake_registry.host}/ml/pytorch:1")
    client = RegistryClient(address, registry_access(address, config_dir=tmp_path), RetryPolicy(retries=0), print)
    try:
        assert client.digest_of("1") == "sha256:" + hashlib.sha256(manifest_body("1")).hexdigest()
    except RegistryError as error:
        assert fake_registry.host in str(error) and "did not answer" in str(error)
    finally:
        late.set()
        fake_registry.by_reference = original
