"""The wheel users install holds every module the commands import (issue 46: a hand-written package list missed
torchimages.build_inputs, so the installed package did not import; only editable installs, which CI used, worked)."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from .conftest import ROOT


def test_the_wheel_holds_every_module_and_data_file_and_imports_from_itself(tmp_path):
    source = tmp_path / "source"  # a copy: setuptools writes build/ beside the project it builds
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "torchimages", source / "torchimages", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("torchimages-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packed = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    sources = {path.relative_to(ROOT).as_posix() for path in (ROOT / "torchimages").rglob("*.py")
               if "__pycache__" not in path.parts}
    assert sources - packed == set(), "modules the wheel leaves out"
    assert "torchimages/checks/suite/pytest.ini" in packed
    site = tmp_path / "site"
    imported = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r}); "
                               "import torchimages, torchimages.builder, torchimages.cli; print(torchimages.__file__)"],
                              capture_output=True, text=True, timeout=120, check=False)
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).is_relative_to(site), "imported from the checkout, not the wheel"
