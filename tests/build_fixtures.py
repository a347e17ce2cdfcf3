"""What the build tests share (test_build, test_build_inputs, test_hostile_files, test_hostile_build_inputs): a
two-row matrix for builds that need no torch, and a small pure-Python wheel."""
import zipfile
from pathlib import Path

from .conftest import with_live_compat


def tiny_matrix(tmp_path: Path) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(
        "registry: localhost:5000/test/tiny\n"
        "defaults: {python: \"3.11\", os: debian12, cuda: cpu}\n"
        "variants:\n"
        "  - torch: 2.13.0\n    flavors: [runtime]\n"
        "  - torch: 2.12.0\n    flavors: [runtime]\n"
    )
    return with_live_compat(path)


def make_wheel(folder: Path, name: str, version: str, body: bytes = b"") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", body)
        archive.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path
