"""Small real wheels, made in tests: what pip and the compat refresh read from a package index."""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), requires_python: str = ">=3.10",
               files: dict[str, bytes] | None = None, tag: str = "cp311-cp311-manylinux_2_28_x86_64") -> Path:
    """A valid wheel (METADATA, WHEEL, RECORD) holding `files`; its name as pip expects it."""
    dist_info = f"{name}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                f"Requires-Python: {requires_python}", *(f"Requires-Dist: {r}" for r in requires)]
    contents = dict(files or {})
    contents[f"{dist_info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    contents[f"{dist_info}/WHEEL"] = f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in contents.items()]
    contents[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for member, data in contents.items():
            wheel.writestr(member, data)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
