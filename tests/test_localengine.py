"""The private engine for real: dockerd answers, the seeded base runs, the registry serves, and `up` is idempotent.

These start the engine when nothing is up yet (root needed then) and never stop it, since other tests share it.
"""
from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import docker
import pytest

from devtools import localengine
from devtools.localengine import EngineInfo, ensure_engine, read_env

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine() -> EngineInfo:
    return ensure_engine()


@pytest.fixture(scope="module")
def client(engine: EngineInfo):
    docker_client = docker.DockerClient(base_url=engine.docker_host, timeout=300)
    yield docker_client
    docker_client.close()


def test_engine_answers_and_runs_the_seeded_base(engine: EngineInfo, client: docker.DockerClient):
    assert client.ping()
    image = client.images.get("debian:bookworm")
    assert image.attrs["Config"]["Cmd"] == ["bash"]
    assert "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in image.attrs["Config"]["Env"]
    output = client.containers.run("debian:bookworm", ["cat", "/etc/debian_version"], remove=True)
    assert re.fullmatch(rb"12\.\d+\n?", output), output


def test_the_arm64_base_is_an_arm64_image_that_runs_here(engine: EngineInfo, client: docker.DockerClient):
    """The aarch64 rows' base, debootstrapped for arm64; on an x86_64 host it runs under the qemu that `up`
    registered with binfmt_misc (fix_binary: nothing of qemu inside the image)."""
    image = client.images.get("arm64v8/debian:bookworm")
    assert (image.attrs["Architecture"], image.attrs["Os"]) == ("arm64", "linux")
    assert image.attrs["Config"]["Cmd"] == ["bash"]
    output = client.containers.run("arm64v8/debian:bookworm", ["sh", "-c", "uname -m; cat /etc/debian_version"],
                                   remove=True)
    machine, version = output.decode().split()
    assert machine == "aarch64" and re.fullmatch(r"12\.\d+", version), output
    if Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").is_file():
        assert "flags: " in (text := Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").read_text()) and "F" in (
            text.split("flags: ")[1].split()[0]), "fix_binary: containers find the interpreter without qemu inside"


def test_registry_answers(engine: EngineInfo):
    with urllib.request.urlopen(f"http://{engine.registry}/v2/", timeout=10) as response:
        assert response.status == 200


def test_second_ensure_reuses_the_running_engine(engine: EngineInfo):
    again = ensure_engine()
    assert (again.docker_host, again.registry, again.started_by_us) == \
        (engine.docker_host, engine.registry, engine.started_by_us)
    assert again.registry_pid == engine.registry_pid
    if engine.started_by_us:
        assert engine.docker_host == localengine.PRIVATE_HOST
        assert engine.dockerd_pid is not None and again.dockerd_pid == engine.dockerd_pid
        assert Path(f"/proc/{engine.dockerd_pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"dockerd")


def test_env_file_describes_the_engine(engine: EngineInfo):
    text = localengine.ENV_FILE.read_text()
    assert text.splitlines() == engine.env_lines()
    assert f"export TORCHIMAGES_REGISTRY={engine.registry}" in text
    assert read_env() == engine
