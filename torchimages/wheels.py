"""Package sources: fetch on the host the wheels a row installs, for offline (air-gapped) builds."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .builder import wheel_dir
from .model import ImageSpec

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")


def requirements(spec: ImageSpec) -> list[str]:
    return [f"torch=={spec.torch}"] + ([f"torchvision=={spec.torchvision}"] if spec.torchvision else [])


def download_command(spec: ImageSpec, dest: Path, index_url: str | None, extra_index_url: str | None) -> list[str]:
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--dest", str(dest),
               "--only-binary=:all:", "--python-version", spec.python, "--implementation", "cp"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    command += ["--index-url", index_url or f"https://download.pytorch.org/whl/{spec.wheel_index}"]
    command += ["--extra-index-url", extra_index_url or "https://pypi.org/simple"]
    return command + requirements(spec)


def fetch_wheels(specs: list[ImageSpec], wheelhouse: Path, index_url: str | None = None,
                 extra_index_url: str | None = None) -> list[Path]:
    """Download each distinct package set once; return the folders filled. Raises on pip failure."""
    done: dict[Path, list[str]] = {}
    for spec in specs:
        dest = wheel_dir(wheelhouse, spec)
        if requirements(spec) == done.get(dest):
            continue
        dest.mkdir(parents=True, exist_ok=True)
        print(f"fetching {' '.join(requirements(spec))} for Python {spec.python} ({spec.wheel_index}) into {dest}",
              file=sys.stderr)
        result = subprocess.run(download_command(spec, dest, index_url, extra_index_url), capture_output=True, text=True)
        if result.returncode != 0:
            raise WheelFetchError(f"pip could not fetch wheels for {spec.tag}:\n{result.stderr.strip()[-2000:]}")
        done[dest] = requirements(spec)
    return list(done)


class WheelFetchError(Exception):
    pass
