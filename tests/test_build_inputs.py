"""The build-input server and the layer install script (issue 27): what a build fetches instead of receiving it as
context. Engine-free: a real server on a loopback address, real HTTP; the builds that use them are in test_build.py."""
from __future__ import annotations

import io
import json
import os
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from torchimages.build_inputs import install_layer
from torchimages.build_inputs.layers import layer_args
from torchimages.build_inputs.server import BUILD_INPUTS_PORT, BuildInputsServer
from torchimages.builder import engine_is_local


def make_wheel(folder: Path, name: str, version: str, body: bytes = b"") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", body)
        archive.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def test_the_server_serves_wheels_metadata_and_settings_then_stops(tmp_path):
    wheel = make_wheel(tmp_path / "wheels", "typing_extensions", "4.16.0", b"x" * 100_000)
    with BuildInputsServer({wheel.name: wheel}, "[global]\nindex-url = https://u:secret@mirror/simple\n", "PEM") as served:
        base = f"http://{served.address}:{BUILD_INPUTS_PORT}"
        page = fetch(f"{base}/wheels/").decode()
        assert 'href="typing_extensions-4.16.0-py3-none-any.whl" data-dist-info-metadata="true"' in page
        assert fetch(f"{base}/wheels/{wheel.name}") == wheel.read_bytes()
        assert b"Name: typing_extensions" in fetch(f"{base}/wheels/{wheel.name}.metadata")
        assert json.loads(fetch(f"{base}/inputs.json"))["ca_bundle"] == "PEM"
        assert zipfile.ZipFile(io.BytesIO(fetch(f"{base}/planner.zip"))).getinfo("pip/__main__.py")
        for outside in ("/wheels/../inputs.json", "/wheels/%2e%2e/etc/passwd", "/etc/passwd", "/wheels/missing.whl"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                fetch(base + outside)
            assert refused.value.code == 404
    with pytest.raises(urllib.error.URLError):
        fetch(f"{base}/inputs.json")


def test_builds_side_by_side_get_addresses_of_their_own(tmp_path):
    with BuildInputsServer({}, "", None) as first, BuildInputsServer({}, "", None) as second:
        assert first.address != second.address and first.address.startswith("127.")


def test_a_torch_only_change_changes_only_the_torch_layer_and_the_rest():
    wheels = {"nvidia_cublas-13.1-py3-none-any.whl": 10, "triton-3.8.0-cp311.whl": 20, "torch-2.14.1-cp311.whl": 30,
              "numpy-2.3.5-cp311.whl": 40}
    before = layer_args(wheels, b"sources", gpu=True)
    after = layer_args({**wheels, "torch-2.14.1-cp311.whl": 31}, b"sources", gpu=True)
    assert [name for name in before if before[name] != after[name]] == ["WHEELS_TORCH", "WHEELS_REST"]
    assert set(layer_args(wheels, b"sources", gpu=False)) == {"WHEELS_TORCH", "WHEELS_REST"}


def test_a_dependency_installed_alone_is_not_marked_requested(tmp_path):
    """--no-deps installs of a dependency mark it REQUESTED; a whole install would not: marker and RECORD line go."""
    dist_info = tmp_path / "nvidia_cublas-13.1.1.3.dist-info"
    dist_info.mkdir()
    (dist_info / "REQUESTED").write_text("")
    (dist_info / "RECORD").write_text("nvidia/x.so,sha256=abc,3\nnvidia_cublas-13.1.1.3.dist-info/REQUESTED,sha256=e3b,0\n")
    install_layer.forget_request(str(tmp_path), {"nvidia-cublas"})
    assert not (dist_info / "REQUESTED").exists()
    assert (dist_info / "RECORD").read_text() == "nvidia/x.so,sha256=abc,3\n"


def test_only_what_the_step_wrote_gets_the_fixed_time(tmp_path):
    old = tmp_path / "old.py"
    old.write_text("")
    os.utime(old, (5, 5))
    since = os.stat(old).st_ctime_ns
    new = tmp_path / "pkg" / "new.py"
    new.parent.mkdir()
    new.write_text("")
    os.chmod(new, 0o744)
    install_layer.normalise_new(str(tmp_path), since, (None, None), 946684800)
    assert os.stat(old).st_mtime == 5, "an earlier layer's file is not touched (it would be copied up)"
    assert os.stat(new).st_mtime == 946684800 and os.stat(new).st_mode & 0o777 == 0o774


@pytest.mark.parametrize(("host", "local"), [("", True), ("unix:///run/x.sock", True), ("tcp://127.0.0.1:2375", True),
                                             ("tcp://build-host.example:2376", False), ("ssh://me@far", False)])
def test_builds_need_an_engine_on_this_host(monkeypatch, host, local):
    monkeypatch.setenv("DOCKER_HOST", host)
    assert engine_is_local() is local
