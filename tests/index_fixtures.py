"""A PEP 691 package index on 127.0.0.1 serving wheels made in the test, answering HTTP range requests as PyPI's
file host does, and counting the bytes it sends (a refresh must not download whole wheels)."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from packaging.utils import parse_wheel_filename

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class LocalIndex:
    def __init__(self, folder: Path):
        self.folder = folder
        self.sent: Counter[str] = Counter()  # file name -> bytes sent
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "LocalIndex":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def project_page(self, project: str) -> bytes | None:
        wheels = sorted(p for p in self.folder.glob("*.whl") if parse_wheel_filename(p.name)[0] == project)
        if not wheels:
            return None
        base = self.url.rsplit("/simple", 1)[0]
        files = [{"filename": p.name, "url": f"{base}/files/{p.name}", "size": p.stat().st_size,
                  "hashes": {"sha256": hashlib.sha256(p.read_bytes()).hexdigest()},
                  "upload-time": "2026-11-20T10:00:00Z"} for p in wheels]
        return json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": files}).encode()

    def _handler(self):
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                page = re.fullmatch(r"/simple/([^/]+)/", self.path)
                if page:
                    body = index.project_page(page[1])
                    return self._send(200, body, JSON_TYPE) if body else self._send(404, b"not found")
                wheel = re.fullmatch(r"/files/([^/]+\.whl)", self.path)
                path = index.folder / wheel[1] if wheel else None
                if path is None or not path.is_file():
                    return self._send(404, b"not found")
                data = path.read_bytes()
                wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
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
