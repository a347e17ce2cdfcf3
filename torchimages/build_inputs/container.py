"""The build-input server on the engine, for an engine that cannot reach this host's loopback (a remote DOCKER_HOST,
Docker Desktop's VM): a container on a network made for one build, answering to BUILD_INPUTS_HOST there (for a
BuildKit build, on the engine host's network, on a loopback address of its own, as server.py serves on this host).

It runs server.py (stdlib only) on the row's own Python: the image of the Dockerfile's `python` stage, which the
build makes first anyway (its layers are the image's first ones, so the build takes them from the cache). Its
folder is uploaded before it starts: the server's code, pip's settings, the builder's planner.zip and the row's
wheels. The container and the network are labelled and always removed, also when the build fails or is cancelled.
If the builder itself is killed, the server still goes: it serves until its standard input closes, and the builder
holds that open (attached) for the build's length; the engine then removes the container (auto-remove), and with it
the uploaded wheels. Only the network, which holds nothing, is left (`docker network prune --filter label=...`)."""
from __future__ import annotations

import io
import json
import re
import secrets
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO, Self

import docker
import docker.errors
import tenacity

from ..model import LABEL_PREFIX, TorchImagesError
from .server import BUILD_INPUTS_HOST, SERVING, planner_zip

SERVER_LABEL = f"{LABEL_PREFIX}.build-inputs"  # on the container and the network: what `docker ps` shows them for
SERVES_LABEL = f"{SERVER_LABEL}.for"  # the build they serve (its log), told apart from another run's on one engine
FOLDER = "/build-inputs"
PACKAGE = Path(__file__).resolve().parent.parent  # torchimages/
CODE = ("__init__.py", "model.py", "build_inputs/__init__.py", "build_inputs/layers.py", "build_inputs/server.py",
        "build_inputs/unpack.py", "build_inputs/install_layer.py")
READY_TIMEOUT_S = 120  # a server starts in under a second; the upload before it is not counted
NETWORK_RELEASE_S = 30  # a cancelled build's step container may still be leaving the network when the build ends


class ServerFailed(TorchImagesError):
    pass


class BuildInputsContainer:
    """A context manager: the network and the serving container on entry, both removed on exit."""

    def __init__(self, api: docker.APIClient, image: str, python: str, wheels: dict[str, Path], pip_conf: str,
                 ca_bundle: str | None, token: str, host_network: bool = False, serves: str = ""):
        """serves: the build this server is for, in words (its log's path), labelled for `docker ps`. host_network: serve on a loopback address of the engine's host instead of a network of the build's own
        (BuildKit runs a build's steps on the host's network or the default one, never on a container's)."""
        self.api = api
        self.host_network = host_network
        self.address = ""  # where it serves on the engine's host (host_network)
        self.image = image  # the row's python stage
        self.python = python  # its interpreter (python3.11, or /opt/python/python3.12)
        self.wheels = wheels
        self.inputs = json.dumps({"pip_conf": pip_conf, "ca_bundle": ca_bundle, "token": token}).encode()
        self.network = f"torchimages-build-inputs-{secrets.token_hex(6)}"
        self.serves = serves
        self._container: str | None = None
        self._lifeline = None  # the attached standard input of the server: closed, the server exits

    def __enter__(self) -> Self:
        labels = {SERVER_LABEL: self.network, SERVES_LABEL: self.serves}
        try:
            if not self.host_network:
                self.api.create_network(self.network, driver="bridge", labels=labels)
            network = "host" if self.host_network else self.network
            self._container = self.api.create_container(
                self.image, [self.python, "-m", "torchimages.build_inputs.server", FOLDER,
                             *(["--loopback"] if self.host_network else [])], user="0",
                environment={"PYTHONPATH": f"{FOLDER}/code", "PYTHONDONTWRITEBYTECODE": "1"}, labels=labels,
                entrypoint=[], stdin_open=True,  # not detached: StdinOnce, its input closes with the builder's attach
                host_config=self.api.create_host_config(network_mode=network, auto_remove=True),
                networking_config=None if self.host_network else self.api.create_networking_config(
                    {self.network: self.api.create_endpoint_config(aliases=[BUILD_INPUTS_HOST])}))["Id"]
            with upload(self.inputs, self.wheels) as folder:
                self.api.put_archive(self._container, "/", folder)
            self._lifeline = self.api.attach_socket(self._container, params={"stdin": 1, "stream": 1})
            try:
                self.api.start(self._container)
            except docker.errors.APIError as error:  # its Python is not there
                raise ServerFailed(f"{self._failed}: {error.explanation}") from None
            self._wait_until_serving()
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def build_network(self) -> tuple[str, dict[str, str]]:
        """How a build's steps reach this server: on its network, where it answers to BUILD_INPUTS_HOST; or on the
        host's network, where that name maps to its loopback address."""
        return ("host", {BUILD_INPUTS_HOST: self.address}) if self.host_network else (self.network, {})

    def __exit__(self, *exc) -> None:
        if self._container:
            try:
                self.api.remove_container(self._container, force=True)
            except docker.errors.APIError as error:
                if error.status_code not in (404, 409):  # gone, or going: it exited and the engine removes it
                    raise
            self._container = None
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None
        if not self.host_network:
            _remove_network(self.api, self.network)

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                logs = self.api.logs(self._container).decode(errors="replace")
                running = self.api.inspect_container(self._container)["State"]["Running"]
            except docker.errors.NotFound:  # it exited, and the engine removed it
                raise ServerFailed(f"{self._failed}: it exited") from None
            serving = re.search(rf"{SERVING} [0-9]+ files at (\S+) port", logs, re.ASCII)
            if serving:
                self.address = serving.group(1)
                return
            if not running:
                raise ServerFailed(f"{self._failed}: it exited: {logs.strip()[-2000:]}")
            time.sleep(0.2)
        raise ServerFailed(f"{self._failed}: it did not answer within {READY_TIMEOUT_S} s")

    @property
    def _failed(self) -> str:
        return f"the build-input server could not start in image {self.image} ({self.python}, the row's python stage)"


@tenacity.retry(retry=tenacity.retry_if_exception(lambda error: isinstance(error, docker.errors.APIError)
                                                 and not isinstance(error, docker.errors.NotFound)),
                stop=tenacity.stop_after_delay(NETWORK_RELEASE_S), wait=tenacity.wait_fixed(0.5), reraise=True)
def _remove_network(api: docker.APIClient, name: str) -> None:
    try:
        api.remove_network(name)
    except docker.errors.NotFound:
        pass  # never made: creating it failed


def upload(inputs: bytes, wheels: dict[str, Path]) -> IO[bytes]:
    """The server's folder as a tar archive (a temporary file: a CUDA row's wheels are gigabytes)."""
    stream = tempfile.TemporaryFile()
    with tarfile.open(fileobj=stream, mode="w") as archive:
        for name in CODE:
            archive.add(PACKAGE / name, f"{FOLDER[1:]}/code/torchimages/{name}")
        add_bytes(archive, "inputs.json", inputs)
        add_bytes(archive, "planner.zip", planner_zip())
        for name, path in sorted(wheels.items()):
            archive.add(path, f"{FOLDER[1:]}/wheels/{name}")
        if not wheels:
            archive.addfile(_folder(f"{FOLDER[1:]}/wheels"))
    stream.seek(0)
    return stream


def add_bytes(archive: tarfile.TarFile, name: str, content: bytes) -> None:
    info = tarfile.TarInfo(f"{FOLDER[1:]}/{name}")
    info.size = len(content)
    archive.addfile(info, io.BytesIO(content))


def _folder(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info
