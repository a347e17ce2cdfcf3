"""A registry that wants a login over TLS, as the platform team's registries do: Debian's docker-registry with a
server certificate for 127.0.0.1 signed by a CA this module makes, plus a Docker config folder holding what
`docker login` writes. Two ways to log in: htpasswd (Basic auth on every request), or Bearer tokens from a token
server (the flow of Harbor, GHCR and Docker Hub) that this module runs, signing JWTs with the test CA's key.

    python -m tests.registry_fixtures FOLDER   # start one by hand (Ctrl-C stops it): prints the env to use
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import bcrypt

from torchimages.peers.registry import RegistryClient

REGISTRY_BIN = "/usr/bin/docker-registry"
USER = "ci-publisher"
START_S = 30
SERVICE, ISSUER = "torchimages-test", "torchimages-test-tokens"


@dataclass
class SecureRegistry:
    host: str  # 127.0.0.1:PORT
    password: str
    ca_file: Path  # the CA that signed the server certificate
    docker_config: Path  # folder of config.json (as `docker login` writes it) and certs.d/<host>/ca.crt
    process: subprocess.Popen
    folder: Path
    token_server: ThreadingHTTPServer | None = None

    @property
    def certs_d(self) -> Path:
        return self.docker_config / "certs.d"

    def env(self) -> dict[str, str]:
        """What a CI job sets after `docker login`: DOCKER_CONFIG naming the folder of config.json."""
        return {**os.environ, "DOCKER_CONFIG": str(self.docker_config)}

    def write_login(self, password: str) -> None:
        """config.json as `docker login HOST` writes it: base64 of user:password under auths."""
        auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
        (self.docker_config / "config.json").write_text(json.dumps({"auths": {self.host: {"auth": auth}}}))

    def request(self, method: str, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
        """One authenticated HTTPS call to the registry API, trusting only the test CA (independent of torchimages)."""
        auth = (f"Bearer {self._token(path)}" if self.token_server else
                "Basic " + base64.b64encode(f"{USER}:{self.password}".encode()).decode())
        request = urllib.request.Request(f"https://{self.host}{path}", method=method,
                                         headers={"Authorization": auth, **(headers or {})})
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def request_status(self) -> int:
        try:
            return self.request("GET", "/v2/")[0]
        except OSError:
            return 0

    def _token(self, path: str) -> str:
        repository = path.removeprefix("/v2/").rsplit("/", 2)[0] if path != "/v2/" else ""
        return sign_token(self.folder / "tls", [{"type": "repository", "name": repository, "actions": ["*"]}])

    def stop(self) -> None:
        if self.token_server is not None:
            self.token_server.shutdown()
            self.token_server.server_close()
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signs for IP 127.0.0.1: (ca.crt, server.crt, server.key)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = folder / "ca.key", folder / "ca.crt"
    key, csr, crt = folder / "server.key", folder / "server.csr", folder / "server.crt"
    extensions = folder / "server.ext"
    extensions.write_text("subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth\n")
    for command in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca_crt, "-days", "2",
         "-subj", "/CN=torchimages test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", "-out", crt, "-days", "2",
         "-extfile", extensions],
    ):
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return ca_crt, crt, key


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_token(tls: Path, access: list[dict]) -> str:
    """A registry token (an RS256 JWT) granting access, signed with the test CA's key; its x5c header carries the
    CA's certificate, which the registry's rootcertbundle trusts."""
    der = subprocess.run(["openssl", "x509", "-in", str(tls / "ca.crt"), "-outform", "DER"], check=True,
                         capture_output=True).stdout
    header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": USER, "aud": SERVICE, "iat": now, "nbf": now - 10, "exp": now + 300,
              "jti": uuid.uuid4().hex, "access": access}
    unsigned = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
    signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(tls / "ca.key")], input=unsigned.encode(),
                               check=True, capture_output=True).stdout
    return f"{unsigned}.{_b64url(signature)}"


def start_token_server(tls: Path, password: str) -> ThreadingHTTPServer:
    """The token endpoint a Bearer registry sends clients to: Basic login in, a token for the asked scopes out."""
    expected = "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode()

    class Tokens(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.end_headers()
                return
            access = []
            for scope in " ".join(parse_qs(urlsplit(self.path).query).get("scope", [])).split():
                kind, _, rest = scope.partition(":")
                name, _, actions = rest.rpartition(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
            token = sign_token(tls, access)
            body = json.dumps({"token": token, "access_token": token, "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Tokens)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls / "server.crt", tls / "server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start_secure_registry(folder: Path, password: str, bearer: bool = False) -> SecureRegistry:
    """Start docker-registry on a free loopback port with TLS and htpasswd auth (or, with bearer, tokens from a token
    server); the caller stops it."""
    ca_crt, crt, key = make_certificates(folder / "tls")
    token_server = start_token_server(folder / "tls", password) if bearer else None
    if token_server:
        auth = {"token": {"realm": f"https://127.0.0.1:{token_server.server_address[1]}/token", "service": SERVICE,
                          "issuer": ISSUER, "rootcertbundle": str(ca_crt)}}
    else:
        htpasswd = folder / "htpasswd"
        htpasswd.write_text(f"{USER}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}\n")
        auth = {"htpasswd": {"realm": "torchimages-test", "path": str(htpasswd)}}
    port = free_port()
    host = f"127.0.0.1:{port}"
    config = folder / "registry.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "version": 0.1, "log": {"level": "error"},
        "storage": {"filesystem": {"rootdirectory": str(folder / "data")}, "delete": {"enabled": True}},
        "auth": auth, "http": {"addr": host, "tls": {"certificate": str(crt), "key": str(key)}},
    }))
    docker_config = folder / "docker-config"
    (docker_config / "certs.d" / host).mkdir(parents=True)
    (docker_config / "certs.d" / host / "ca.crt").write_bytes(ca_crt.read_bytes())
    log = open(folder / "registry.log", "wb")  # noqa: SIM115 - the registry writes to it until stopped
    process = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    registry = SecureRegistry(host, password, ca_crt, docker_config, process, folder, token_server)
    registry.write_login(password)
    deadline = time.monotonic() + START_S
    while registry.request_status() != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            registry.stop()
            raise RuntimeError(f"the test registry did not start: {(folder / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return registry


def start_refusing_proxy(upstream: str, refused: Callable[[str, str], bool]) -> ThreadingHTTPServer:
    """A plain-HTTP proxy on a free loopback port in front of a registry at upstream (HOST:PORT), answering 403 DENIED
    (as a registry with immutable or protected tags does) to every request refused(method, path) names; the caller
    shuts it down. The Host header is passed on, so the registry's upload locations point at the proxy."""

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if refused(self.command, self.path):
                message = json.dumps({"errors": [{"code": "DENIED", "message": "tag is protected"}]}).encode()
                self.send_response(403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(message)))
                self.end_headers()
                self.wfile.write(message)
                return
            connection = http.client.HTTPConnection(upstream, timeout=60)
            connection.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():  # repeated headers (a client's several Accept:) stay repeated
                connection.putheader(name, value)
            connection.endheaders(body)
            answer = connection.getresponse()
            data = answer.read()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            connection.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = forward

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)  # `kill PID` stops the registry too
    running = start_secure_registry(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else f"pw-{uuid.uuid4().hex}")
    print(f"registry {running.host} (pid {running.process.pid}); export DOCKER_CONFIG={running.docker_config}", flush=True)
    try:
        running.process.wait()
    except KeyboardInterrupt:
        running.stop()


class ServingRegistry:
    """A read-only registry API on a free loopback port, plain HTTP, answering manifests (reference -> body) and blobs
    (digest -> bytes) exactly as a test filled them in: a digest may be answered with another manifest's bytes, as a
    hostile registry (or a proxy in front of one) answers. The caller closes it."""

    def __init__(self, repository: str = "ml/pytorch"):
        self.repository = repository
        self.manifests: dict[str, bytes] = {}
        self.blobs: dict[str, bytes] = {}
        served = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                prefix = f"/v2/{served.repository}/"
                path = urlsplit(self.path).path
                if path == "/v2/":
                    return self._send(200, b"{}")
                if path == prefix + "tags/list":
                    tags = sorted(name for name in served.manifests if not name.startswith("sha256:"))
                    return self._send(200, json.dumps({"name": served.repository, "tags": tags}).encode())
                kind, _, reference = path.removeprefix(prefix).partition("/")
                body = {"manifests": served.manifests, "blobs": served.blobs}.get(kind, {}).get(reference)
                if body is None:
                    unknown = "MANIFEST_UNKNOWN" if kind == "manifests" else "BLOB_UNKNOWN"
                    return self._send(404, json.dumps({"errors": [{"code": unknown, "message": "unknown"}]}).encode())
                return self._send(200, body, _media_type(body) if kind == "manifests" else "application/octet-stream",
                                  reference)

            do_HEAD = do_GET

            def _send(self, status: int, body: bytes, kind: str = "application/json", digest: str = ""):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                if digest.startswith("sha256:"):  # a lying registry names the digest it was asked for
                    self.send_header("Docker-Content-Digest", digest)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def serve(self, reference: str, body: bytes, blobs: dict[str, bytes] | None = None) -> str:
        """Answer reference (a tag, or any digest) with body, and serve blobs; the body's own digest."""
        self.manifests[reference] = body
        self.blobs.update(blobs or {})
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _media_type(body: bytes) -> str:
    try:
        return json.loads(body).get("mediaType") or "application/vnd.docker.distribution.manifest.v2+json"
    except (ValueError, AttributeError):
        return "application/vnd.docker.distribution.manifest.v2+json"


def tiny_image(client: RegistryClient) -> tuple[str, dict]:
    """A small image of its own pushed as :latest (no engine): its digest and descriptor."""
    layer, config = uuid.uuid4().hex.encode(), b"{}"
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 2,
                                      "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "size": len(layer),
                                       "digest": "sha256:" + hashlib.sha256(layer).hexdigest()}]}).encode()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "image"
        folder.mkdir()
        for name, content in {"version": b"Directory Transport Version: 1.1\n", "manifest.json": manifest,
                              hashlib.sha256(config).hexdigest(): config,
                              hashlib.sha256(layer).hexdigest(): layer}.items():
            (folder / name).write_bytes(content)
        client.write_artifact(folder, "latest")
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    return digest, {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": len(manifest)}
