"""The downstream check's host side: a tiny pure-Python wheel, and an image built FROM the image under test whose
Dockerfile pip-installs that wheel as the image's own user, as a team's Dockerfile would. No network: the build runs
with network none and pip with --no-index. The derived image is removed on success, failure and Ctrl-C."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import secrets
import tarfile
import time
import zipfile

import docker
import docker.errors
import requests.exceptions

MODULE = "torchimages_downstream_check"  # the probe imports the module named by the wheel's first name part
VERSION = "1.0"
WHEEL = f"{MODULE}-{VERSION}-py3-none-any.whl"
CONTAINER_DIR = "/tmp/torchimages-downstream"
IMAGE_REPOSITORY = "torchimages-downstream"
DOCKERFILE = f"""\
# What a team's Dockerfile does with a base image: install its own package into the image's Python environment
# (not ~/.local, which pip falls back to when that is not writable), as the image's default user.
FROM {{base}}
{{labels}}
COPY {WHEEL} {CONTAINER_DIR}/
RUN pip install --no-index --no-cache-dir --disable-pip-version-check {CONTAINER_DIR}/{WHEEL} \\
 && python -c "import sys, {MODULE} as m; assert m.__file__.startswith(sys.prefix + '/'), \\
    'pip installed ' + m.__file__ + ', outside the image environment ' + sys.prefix"
"""
STEP_IMAGE = re.compile(r"^ ---> ([0-9a-f]{12})$", re.M)
# Wheels are zip files; a fixed timestamp makes the same bytes every run.
ZIP_TIME = (2020, 1, 1, 0, 0, 0)


def wheel_bytes() -> bytes:
    """A valid wheel made with the standard library: one module, METADATA, WHEEL and a RECORD with hashes."""
    dist_info = f"{MODULE}-{VERSION}.dist-info"
    files = {
        f"{MODULE}/__init__.py": b'"""Installed by the torchimages downstream check."""\nINSTALLED = True\n',
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: {VERSION}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: torchimages\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(zipfile.ZipInfo(path, ZIP_TIME), data)
    return buffer.getvalue()


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dockerfile(base: str, labels: dict[str, str]) -> str:
    """Labels first: every step's image carries them, so a run that died mid-build leaves findable leftovers."""
    label_line = "LABEL " + " ".join(f"{key}={json.dumps(value)}" for key, value in labels.items())
    return DOCKERFILE.format(base=base, labels=label_line)


def build_context(dockerfile_text: str, wheel: bytes) -> io.BytesIO:
    """The build context as an in-memory tar: the Dockerfile and the wheel, nothing from disk."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in (("Dockerfile", dockerfile_text.encode()), (WHEEL, wheel)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def derived_image_facts(docker_client: docker.DockerClient, base_image_id: str, labels: dict[str, str]) -> dict:
    """Build the derived image, report how that went, and remove it: the facts the downstream check asserts on."""
    tag = f"{IMAGE_REPOSITORY}:{secrets.token_hex(6)}"
    started, log, error = time.monotonic(), [], ""
    try:
        # rm/forcerm: the builder removes its step containers, also when a step fails.
        context = build_context(dockerfile(base_image_id, labels), wheel_bytes())
        for chunk in docker_client.api.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True,
                                             network_mode="none", decode=True):
            log.append(chunk.get("stream", ""))
            if "error" in chunk:
                error = chunk["error"].strip()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as failure:
        error = f"{type(failure).__name__}: {failure}"
    finally:
        remove_image(docker_client, tag)
        for step_image in reversed(step_images("".join(log), base_image_id)):
            remove_image(docker_client, step_image)
    return {"ok": not error, "error": error, "log": "".join(log)[-3000:], "dockerfile": dockerfile("IMAGE", labels),
            "user": docker_client.api.inspect_image(base_image_id)["Config"].get("User") or "",
            "seconds": round(time.monotonic() - started, 3)}


def step_images(log: str, base_image_id: str) -> list[str]:
    """The images the build's steps left (` ---> 1a2b3c4d5e6f`): a failed build keeps those of its successful
    steps. The first is the base image itself, which is never ours to remove."""
    base = base_image_id.removeprefix("sha256:")
    return [image for image in STEP_IMAGE.findall(log) if not base.startswith(image)]


def remove_image(docker_client: docker.DockerClient, image: str) -> None:
    try:
        docker_client.api.remove_image(image, force=True)
    except docker.errors.NotFound:
        pass
