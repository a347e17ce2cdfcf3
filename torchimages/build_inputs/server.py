"""The build-input server: what one build fetches over HTTP instead of receiving it in its context.

It serves the row's wheelhouse as a find-links page (with PEP 658 metadata, so that pip's dry runs read no wheel),
pip's settings (index URLs with their credentials, the CA bundle), the layer install script, and each venv layer a
step planned, unpacked here as a tar stream (unpack.py). The build reaches it by the host name BUILD_INPUTS_HOST
on a fixed port, so the rendered Dockerfile and the engine's cache key never change with where it runs:
- on this host (a local engine), on a loopback address of its own: the build runs with the host's network
  (`network_mode="host"`) and the builder maps the name to that address; builds side by side each get a 127.x.y.z;
- in a container on the engine (a remote one, or Docker Desktop's, which does not share this host's loopback):
  container.py runs this module there (`python -m torchimages.build_inputs.server FOLDER`, stdlib only) on a network
  of the build's own, under that name; for a BuildKit build, whose steps join no container's network, on a loopback
  address of the engine's host (`--loopback`), as on this host.

Any local user can reach a loopback address (its port shows in /proc/net/tcp), so every request but the install
script's (the toolkit's published source) must carry the build's own secret: HTTP Basic, user `build`, password
the token. The build's steps get it in the predefined `no_proxy` build arg, as an entry `<token>.build-inputs.invalid`
that matches no host: Docker keeps predefined proxy args out of the image history, its config and the cache key
(moby's prependEnvOnCmd; BuildKit's ProxyEnv), so the token reaches no layer and changes no cache hit."""
from __future__ import annotations

import base64
import functools
import hmac
import html
import importlib.util
import io
import json
import marshal
import posixpath
import random
import secrets
import socket
import sys
import threading
import zipfile
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Self, cast
from urllib.parse import quote, unquote

from .layers import INSTALL_SCRIPT
from .unpack import LayerWheel, Venv, WheelError, read_wheels, unpack

BUILD_INPUTS_HOST = "torchimages-build-inputs"
BUILD_INPUTS_PORT = 8679
BUILD_INPUTS_URL = f"http://{BUILD_INPUTS_HOST}:{BUILD_INPUTS_PORT}"
BIND_TRIES = 50
MAX_REQUEST_BYTES = 1 << 20  # a layer request names wheels and a venv: kilobytes (the script template is the most)
TOKEN_USER = "build"
TOKEN_HOST_SUFFIX = ".build-inputs.invalid"  # install_layer.py reads the token back from no_proxy by this suffix
PUBLIC_PATHS = ("/install_layer.py",)  # fetched by the Dockerfile's own step, which has no token to send
REQUEST_TIMEOUT_S = 60  # a client that sends part of a request and stops holds its thread no longer


class BuildInputsServer:
    """A context manager: started on entry, always stopped (and its socket closed) on exit."""

    def __init__(self, wheels: dict[str, Path], pip_conf: str, ca_bundle: str | None, token: str,
                 listen: str | None = None, planner: bytes | None = None, debs: dict[str, Path] | None = None):
        """token: the build's secret (new_token()), required on every request but PUBLIC_PATHS; listen: the address
        to serve on (a free loopback address when None); planner: planner.zip's bytes (made from this interpreter's
        pip when None); debs: pinned .debs and their indexes, served under /debs/ (deb_pins.served)."""
        self.wheels = wheels
        self.debs = debs or {}
        self.authorization = basic_authorization(token)
        self.listen = listen
        self.planner = planner
        self.metadata = {name: _metadata(path) for name, path in wheels.items() if name.endswith(".whl")}
        self.inputs = json.dumps({"pip_conf": pip_conf, "ca_bundle": ca_bundle}).encode()
        self.layer_errors: list[str] = []  # why a layer's stream was cut short (GET /layer-error: the last)
        self.address = ""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        server = self._server = _bind(self) if self.listen is None else _listen(self, self.listen)
        self.address = str(server.server_address[0])
        self._thread = threading.Thread(target=server.serve_forever, name="build-inputs", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server and self._thread:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None

    @property
    def build_network(self) -> tuple[str, dict[str, str]]:
        """How a build's steps reach this server: the host's network, where its name maps to its loopback address."""
        return "host", {BUILD_INPUTS_HOST: self.address}

    def page(self) -> bytes:
        meta = ' data-dist-info-metadata="true" data-core-metadata="true"'
        links = "".join(f'<a href="{html.escape(quote(name))}"{meta if name in self.metadata else ""}>'
                        f"{html.escape(name)}</a>\n" for name in sorted(self.wheels))
        return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()


def new_token() -> str:
    """A build's secret: hexadecimal, so that it is a valid host-name label in no_proxy."""
    return secrets.token_hex(24)


def token_arg(token: str) -> str:
    """The no_proxy entry that carries the token to the build's steps."""
    return token + TOKEN_HOST_SUFFIX


def basic_authorization(token: str) -> str:
    return "Basic " + base64.b64encode(f"{TOKEN_USER}:{token}".encode()).decode()


def authorized_url(token: str) -> str:
    """BUILD_INPUTS_URL with the build's login in it, for pip (which sends it on each request to that host)."""
    return f"http://{TOKEN_USER}:{token}@{BUILD_INPUTS_HOST}:{BUILD_INPUTS_PORT}"


def _bind(owner: BuildInputsServer) -> ThreadingHTTPServer:
    """A free 127.x.y.z on the fixed port: other builds (this run's, other checkouts') hold theirs."""
    rng = random.SystemRandom()
    for _ in range(BIND_TRIES):
        address = f"127.{rng.randrange(1, 255)}.{rng.randrange(0, 256)}.{rng.randrange(1, 255)}"
        try:
            server = ThreadingHTTPServer((address, BUILD_INPUTS_PORT), _handler(owner))
        except OSError:
            continue
        server.daemon_threads = True
        return server
    raise OSError(f"no free loopback address for the build-input server on port {BUILD_INPUTS_PORT}")


def _listen(owner: BuildInputsServer, address: str) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((address, BUILD_INPUTS_PORT), _handler(owner))
    server.daemon_threads = True
    return server


def _handler(owner: BuildInputsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S

        def do_GET(self) -> None:
            path = unquote(self.path.split("?", 1)[0])
            if path not in PUBLIC_PATHS and not self._authorized():
                return
            if path == "/inputs.json":
                self._send(owner.inputs, "application/json")
            elif path == "/planner.zip":
                self._send(owner.planner if owner.planner is not None else planner_zip(), "application/zip")
            elif path == "/layer-error":
                self._send((owner.layer_errors[-1] if owner.layer_errors else "").encode(), "text/plain")
            elif path == "/install_layer.py":
                self._send(INSTALL_SCRIPT.read_bytes(), "text/x-python")
            elif path in ("/wheels", "/wheels/"):
                self._send(owner.page(), "text/html")
            elif path.startswith("/wheels/") and path.endswith(".metadata") and path[8:-9] in owner.metadata:
                self._send(owner.metadata[path[8:-9]], "text/plain")
            elif path.startswith("/wheels/") and path[8:] in owner.wheels:
                self._send_file(owner.wheels[path[8:]])
            elif path.startswith("/debs/") and posixpath.normpath(path[6:]) in owner.debs:  # apt asks for ./Packages
                self._send_file(owner.debs[posixpath.normpath(path[6:])])
            else:
                self.send_error(HTTPStatus.NOT_FOUND)

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if unquote(self.path) != "/layer.tar":
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            try:
                wheels, venv = layer_request(json.loads(self._body()), owner.wheels)
                layer = read_wheels(wheels, venv)
            except (KeyError, TypeError, ValueError, WheelError, OSError, RecursionError) as error:
                # RecursionError: a request nested deeper than json can parse (a bounded body can still be that deep)
                self._send(f"no layer: {type(error).__name__ if isinstance(error, RecursionError) else error}\n".encode(),
                           "text/plain", HTTPStatus.BAD_REQUEST)
                return
            # No length: the stream is unpacked as it is sent. Chunked, so that its end is said: a layer cut short
            # (a damaged member found mid-stream) lacks the last chunk, which the step's HTTP reader refuses, where
            # a tar cut at a member's end extracts without a word (GNU tar exits 0).
            self.protocol_version = "HTTP/1.1"
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/x-tar")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            body = ChunkedBody(self.wfile)
            try:
                unpack(layer, venv, cast(IO[bytes], body))
                body.end()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the build step went away (cancelled)
            except (WheelError, OSError) as error:
                owner.layer_errors.append(str(error))

        def _authorized(self) -> bool:
            """Whether the request carries this build's secret; if not, it is answered 401 and nothing else."""
            given = (self.headers.get("Authorization") or "").encode("ascii", "replace")
            if hmac.compare_digest(given, owner.authorization.encode()):
                return True
            self.send_response(HTTPStatus.UNAUTHORIZED)
            self.send_header("WWW-Authenticate", 'Basic realm="build inputs"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.close_connection = True
            return False

        def _body(self) -> bytes:
            """The request's body, which must say its length and be no larger than a layer request needs."""
            length = self.headers.get("Content-Length", "")
            if not length.isascii() or not length.isdigit() or int(length) > MAX_REQUEST_BYTES:
                raise ValueError(f"a request body needs a Content-Length of at most {MAX_REQUEST_BYTES} bytes")
            return self.rfile.read(int(length))

        def _send(self, body: bytes, content_type: str, status: HTTPStatus = HTTPStatus.OK) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _send_file(self, path: Path) -> None:
            with path.open("rb") as handle:
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(path.stat().st_size))
                self.end_headers()
                self.wfile.flush()
                try:
                    socket.socket.sendfile(self.connection, handle)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the build step went away (cancelled): nothing to serve it

        def log_message(self, *args) -> None:
            pass  # the build log shows what pip fetched

    return Handler


class ChunkedBody:
    """HTTP/1.1's chunked transfer coding over a handler's stream: each write one chunk, end() the last one."""

    def __init__(self, out: io.BufferedIOBase | IO[bytes]) -> None:
        self.out = out

    def write(self, data: bytes) -> int:
        if data:
            self.out.write(b"%x\r\n" % len(data))
            self.out.write(data)
            self.out.write(b"\r\n")
        return len(data)

    def end(self) -> None:
        self.out.write(b"0\r\n\r\n")
        self.out.flush()


def layer_request(request: dict, wheels: dict[str, Path]) -> tuple[list[LayerWheel], Venv]:
    """The wheels (served ones only, by file name) and the venv a build step asked a layer for."""
    chosen = [LayerWheel(wheels[name], bool(requested)) for name, requested in request["wheels"]]
    venv = request["venv"]
    return chosen, Venv(str(venv["root"]), str(venv["site"]), str(venv["interpreter"]), str(venv["python"]),
                        str(venv["script_template"]), int(venv["uid"]), int(venv["gid"]), int(venv["time"]))


def _metadata(wheel: Path) -> bytes:
    """A wheel's METADATA file (PEP 658), read from its zip directory: a few kilobytes of a large file."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return archive.read(name)


@functools.cache
@functools.cache  # made once a process: every build's every layer step fetches it
def planner_zip() -> bytes:
    """The builder's own pip as a zip the build steps put on PYTHONPATH to plan a layer: `pip install --dry-run
    --report` with it reads only the served metadata, where an image's older pip (Debian 12's 23.0) downloads every
    wheel to plan and compares names unnormalised. The image's own pip then installs the plan (the same files).

    Each module has its bytecode beside it, as zipimport looks for it (module.pyc): a step cannot write bytecode into
    a zip, so without it every plan compiled the pip it imports, about 1.5 s of each of a CUDA row's eight plans
    (issue 58's cold build). Unchecked-hash: the zip is made at once from one pip, so source and bytecode cannot
    part. An image whose Python has another magic number than this interpreter's passes over them to the sources."""
    import pip  # the builder's own; the server in a container is given the zip instead

    root = Path(pip.__file__).parent
    stream = io.BytesIO()
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                name = str(path.relative_to(root.parent))
                archive.write(path, name)
                if path.suffix == ".py":
                    archive.writestr(zipfile.ZipInfo(name[:-3] + ".pyc", date_time=(1980, 1, 1, 0, 0, 0)),
                                     unchecked_hash_pyc(path.read_bytes(), name))
    return stream.getvalue()


def unchecked_hash_pyc(source: bytes, name: str) -> bytes:
    """The bytecode file of source for this interpreter (PEP 552: magic, flags 0b01 = hash-based and unchecked, the
    source's hash, the marshalled code)."""
    code = compile(source, name, "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little") + importlib.util.source_hash(source) + \
        marshal.dumps(code)


# In a container on the engine (container.py): the folder it was given holds inputs.json, planner.zip and wheels/.
SERVING = "build-input server: serving"


def serve_folder(folder: Path, listen: str | None) -> None:
    """Serve the folder on listen (every address of a network of the build's own), or on a free loopback address
    of the engine's host (None: a BuildKit build's steps on the host's network); say where, once serving."""
    inputs = json.loads((folder / "inputs.json").read_text())
    wheels = {path.name: path for path in sorted((folder / "wheels").iterdir())}
    with BuildInputsServer(wheels, inputs["pip_conf"], inputs["ca_bundle"], inputs["token"], listen,
                           (folder / "planner.zip").read_bytes()) as server:
        print(f"{SERVING} {len(wheels)} files at {server.address} port {BUILD_INPUTS_PORT}", flush=True)
        sys.stdin.buffer.read()  # until the builder closes it (it is done, or was killed)


if __name__ == "__main__":
    serve_folder(Path(sys.argv[1]), None if sys.argv[2:] == ["--loopback"] else "0.0.0.0")
