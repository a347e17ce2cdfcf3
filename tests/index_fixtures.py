"""A PEP 691 package index on 127.0.0.1 serving wheels made in the test, answering HTTP range requests as PyPI's
file host does, and counting the bytes it sends (a refresh must not download whole wheels)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from packaging.utils import parse_wheel_filename

from .wheels_fixtures import make_wheel

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class LocalIndex:
    """`files_url`: where the project pages say the wheels are (another server, e.g. one that never answers);
    `ranges`: False for a file host that ignores Range and sends every file whole."""

    def __init__(self, folder: Path, files_url: str | None = None, ranges: bool = True,
                 login: tuple[str, str] | None = None):
        self.folder = folder
        # A mirror that wants a login (Basic) for its pages and files; every Authorization it was sent is kept.
        self.login = "Basic " + base64.b64encode(":".join(login).encode()).decode() if login else None
        self.authorizations: list[str] = []
        self.yanked: set[str] = set()  # file names the pages mark yanked (PEP 592)
        self.pages: Counter[str] = Counter()  # project -> pages served
        self.files_url = files_url
        self.ranges = ranges
        self.sent: Counter[str] = Counter()  # file name -> bytes sent
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LocalIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def project_page(self, project: str) -> bytes | None:
        wheels = sorted(p for p in self.folder.glob("*.whl") if parse_wheel_filename(p.name)[0] == project)
        if not wheels:
            return None
        base = self.files_url or self.url.rsplit("/simple", 1)[0] + "/files"
        files = [{"filename": p.name, "url": f"{base}/{p.name}", "size": p.stat().st_size,
                  "hashes": {"sha256": hashlib.sha256(p.read_bytes()).hexdigest()},
                  "upload-time": "2026-11-20T10:00:00Z", **({"yanked": "broken"} if p.name in self.yanked else {})}
                 for p in wheels]
        return json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": files}).encode()

    def _handler(self):
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                index.authorizations.append(self.headers.get("Authorization", ""))
                if index.login and self.headers.get("Authorization") != index.login:
                    return self._send(401, b"login required", extra={"WWW-Authenticate": 'Basic realm="mirror"'})
                page = re.fullmatch(r"/simple/([^/]+)/", self.path)
                if page:
                    index.pages[page[1]] += 1
                    body = index.project_page(page[1])
                    return self._send(200, body, JSON_TYPE) if body else self._send(404, b"not found")
                wheel = re.fullmatch(r"/files/([^/]+\.whl)", self.path)
                path = index.folder / wheel[1] if wheel else None
                if path is None or not path.is_file():
                    return self._send(404, b"not found")
                data = path.read_bytes()
                wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "")) if index.ranges else None
                if not wanted:
                    index.sent[path.name] += len(data)
                    return self._send(200, data)
                first, last = wanted.groups()
                start = len(data) - int(last) if not first else int(first)
                end = len(data) - 1 if not first or not last else min(int(last), len(data) - 1)
                start = max(start, 0)
                index.sent[path.name] += end - start + 1
                self._send(206, data[start:end + 1], extra={"Content-Range": f"bytes {start}-{end}/{len(data)}"})

            def _send(self, status: int, body: bytes, kind: str = "application/octet-stream", extra=None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                for name, value in (extra or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        return Handler


class SilentServer:
    """A server that accepts connections and never answers: a stalled index or file host."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.socket.accept()[0])
            except OSError:
                return

    def __enter__(self) -> SilentServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.socket.close()
        for connection in self.held:
            connection.close()


PINS = ("cuda-toolkit[cublas,cudart]==13.2.2; platform_system == \"Linux\"",
        "nvidia-cudnn-cu13==9.30.0.1; platform_system == \"Linux\"", "nvidia-nccl-cu13==2.31.0",
        "nvidia-cusparselt-cu13==0.9.0", "nvidia-nvshmem-cu13==3.8.0", "triton~=3.10.0", "filelock")
ARCH_FLAGS = b"\x00sm_75 sm_90 sm_120 compute_120\x00"


def version_py(version: str, cuda: str | None) -> bytes:
    return (f"from typing import Optional\n__version__ = '{version}'\ndebug = False\n"
            f"cuda: Optional[str] = {repr(cuda)}\n").encode()


def make_release(wheels: Path, cuda_library_size: int = 4 << 20, torch: str = "2.16.0") -> Path:
    """A torch release (2.16.0: one above the fixture project's newest) as PyPI has it (the cu132 build under the
    plain version, cp311 and cp314), its CPU build, the torchvision that requires it, and NumPy. libtorch_cuda.so
    is large and incompressible, as the real one."""
    make_wheel(wheels, "torch", torch, PINS, ">=3.11", files={
        "torch/version.py": version_py(f"{torch}+cu132", "13.2"),
        "torch/lib/libtorch_python.so": b"\x7fELF" + os.urandom(1 << 16) + ARCH_FLAGS + os.urandom(1 << 10),
        "torch/lib/libtorch_cuda.so": os.urandom(cuda_library_size)})
    make_wheel(wheels, "torch", torch, PINS, ">=3.11", tag="cp314-cp314-manylinux_2_28_x86_64")
    make_wheel(wheels, "torch", torch, PINS, ">=3.11", tag="cp315-cp315t-manylinux_2_28_x86_64")
    make_wheel(wheels, "torch", f"{torch}+cpu", ("filelock",), ">=3.11",
               files={"torch/version.py": version_py(f"{torch}+cpu", None)})
    make_wheel(wheels, "torchvision", "0.31.0", (f"torch=={torch}",), tag="cp311-cp311-manylinux_2_28_x86_64")
    make_wheel(wheels, "torchvision", "0.30.0", ("torch==2.15.0",), tag="cp311-cp311-manylinux_2_28_x86_64")
    # NumPy as PyPI has it: the newest final release with a cp311 wheel is the pin, not the pre-release.
    make_wheel(wheels, "numpy", "2.4.1", (), ">=3.11", tag="cp311-cp311-manylinux_2_28_x86_64")
    make_wheel(wheels, "numpy", "2.3.5", (), ">=3.11", tag="cp311-cp311-manylinux_2_28_x86_64")
    make_wheel(wheels, "numpy", "2.5.0rc1", (), ">=3.11", tag="cp311-cp311-manylinux_2_28_x86_64")
    return wheels
