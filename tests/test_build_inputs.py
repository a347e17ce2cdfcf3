"""The build-input server and the layer install script (issue 27): what a build fetches instead of receiving it as
context. Engine-free: a real server on a loopback address, real HTTP; the builds that use them are in test_build.py."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from torchimages.build.builder import default_inputs_server, engine_is_local
from torchimages.build_inputs import install_layer
from torchimages.build_inputs.container import upload
from torchimages.build_inputs.layers import layer_args
from torchimages.build_inputs.server import (
    BUILD_INPUTS_PORT,
    TOKEN_HOST_SUFFIX,
    BuildInputsServer,
    basic_authorization,
    planner_zip,
)
from torchimages.build_inputs.unpack import LayerWheel, Venv, read_wheels, record_hash, unpack

from .build_fixtures import make_wheel
from .conftest import ROOT, SHARED_STEPS, one_process_at_a_time, run_cli, with_live_compat

TOKEN = "0123456789abcdef" * 3  # the build's secret, as new_token() makes one


def fetch(url: str, token: str | None = TOKEN) -> bytes:
    headers = {"Authorization": basic_authorization(token)} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
        return response.read()


def test_the_server_serves_wheels_metadata_and_settings_then_stops(tmp_path):
    wheel = make_wheel(tmp_path / "wheels", "typing_extensions", "4.16.0", b"x" * 100_000)
    with BuildInputsServer({wheel.name: wheel}, "[global]\nindex-url = https://u:secret@mirror/simple\n", "PEM",
                           TOKEN) as served:
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
    with BuildInputsServer({}, "", None, TOKEN) as first, BuildInputsServer({}, "", None, TOKEN) as second:
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
def test_an_engine_on_another_host_gets_the_build_input_server_on_the_engine(monkeypatch, host, local):
    monkeypatch.setenv("DOCKER_HOST", host)
    assert engine_is_local() is local
    assert default_inputs_server() == ("loopback" if local else "container")


def test_the_server_uploaded_to_the_engine_runs_on_the_standard_library_alone(tmp_path):
    """What container.py uploads is all the server imports: run with the host's Python without site-packages (no
    docker, no PyYAML, no pip), it starts from the uploaded folder as it does in the python stage's image."""
    wheel = make_wheel(tmp_path / "wheels", "typing_extensions", "4.16.0")
    with tarfile.open(fileobj=upload(b'{"pip_conf": "", "ca_bundle": null, "token": "t"}', {wheel.name: wheel})) as archive:
        archive.extractall(tmp_path / "root", filter="data")
    folder = tmp_path / "root" / "build-inputs"
    assert (folder / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    assert zipfile.ZipFile(folder / "planner.zip").getinfo("pip/__main__.py")
    probe = ("import sys; from pathlib import Path; import torchimages.build_inputs.server as server; "
             "assert 'pip' not in sys.modules and 'docker' not in sys.modules; "
             "print(server.BuildInputsServer({}, '', None, 't').planner is None, server.INSTALL_SCRIPT.exists())")
    result = subprocess.run([sys.executable, "-S", "-c", probe], env={"PYTHONPATH": str(folder / "code")},
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stdout.split() == ["True", "True"], result.stderr


def make_full_wheel(folder: Path) -> Path:
    """A wheel with every part pip treats apart: console and GUI scripts, a `#!python` script of its own, headers,
    data, an executable file, shipped bytecode."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "demo_pkg-1.0-py3-none-any.whl"
    files = {
        "demo_pkg/__init__.py": b"def main():\n    return 0\n",
        "demo_pkg/tool.sh": b"#!/bin/sh\necho tool\n",
        "demo_pkg/__pycache__/__init__.cpython-311.pyc": b"\x00bytecode",
        "demo_pkg-1.0.data/scripts/demo-own": b"#!python\nprint('own script')\n",
        "demo_pkg-1.0.data/headers/demo.h": b"int demo;\n",
        "demo_pkg-1.0.data/data/share/man/man1/demo.1": b".TH DEMO 1\n",
        "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo_pkg\nVersion: 1.0\n",
        "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "demo_pkg-1.0.dist-info/entry_points.txt": b"[console_scripts]\ndemo = demo_pkg:main\n"
                                                   b"demo-sub = demo_pkg.sub.cli:run.go [extra]\n"
                                                   b"[gui_scripts]\ndemo-gui = demo_pkg:main\n",
    }
    record = "".join(f"{name},{record_hash(body)},{len(body)}\n" for name, body in files.items())
    with zipfile.ZipFile(path, "w") as archive:
        for name, body in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o755 if name.endswith((".sh", "demo-own")) else 0o644) << 16
            archive.writestr(info, body)
        archive.writestr("demo_pkg-1.0.dist-info/RECORD", record + "demo_pkg-1.0.dist-info/RECORD,,\n")
    return path


def test_a_layer_unpacked_on_the_host_holds_what_pip_writes(tmp_path):
    """The same wheel installed from a find-links folder by a real venv's own pip (--no-deps --no-compile), and unpacked
    into a tar stream for that venv (with that pip's script template, as the build step reads it) and extracted into
    it afresh: the same files, bytes (RECORD included) and modes (pip's, with the build's g=u), but the bytecode a
    wheel ships (the image has none; RECORD lists it as pip's does); every entry at the layer's owner and time;
    folders only where the layer adds to them."""
    wheel = make_full_wheel(tmp_path / "wheels")
    venv = tmp_path / "opt" / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    own = set(tree(venv))  # the venv's own files (pip, setuptools): no part of the layer
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-compile", "--no-index", "--find-links",
                    str(wheel.parent), "--disable-pip-version-check", "--quiet", "demo_pkg==1.0"], check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    by_pip = {path: entry for path, entry in tree(venv, group_like_user=True).items() if path not in own}
    template = install_layer.script_template(python)
    for installed in venv.glob("lib/python3*/site-packages/demo_pkg*"):
        shutil.rmtree(installed)
    for script in ("demo", "demo-gui", "demo-own", "demo-sub"):
        (venv / "bin" / script).unlink()
    shutil.rmtree(venv / "include" / "site")
    shutil.rmtree(venv / "share")
    site = next(venv.glob("lib/python3*/site-packages"))
    layer = Venv(str(venv), str(site), python, "{}.{}".format(*sys.version_info[:2]), template, os.getuid(),
                 os.getgid(), 946684800)
    stream = io.BytesIO()
    unpack(read_wheels([LayerWheel(wheel, requested=True)], layer), layer, stream)
    stream.seek(0)
    with tarfile.open(fileobj=stream) as tar:
        members = tar.getmembers()
        tar.extractall("/", filter="fully_trusted")  # the members are the venv's absolute paths, here in tmp_path
    ours = {path: entry for path, entry in tree(venv).items() if path not in own}
    assert ours == {path: entry for path, entry in by_pip.items() if "__pycache__" not in path}
    assert {(member.uid, member.gid, member.mtime) for member in members} == {(os.getuid(), os.getgid(), 946684800)}
    folders = {"/" + member.name for member in members if member.isdir()}
    assert str(site) in folders and str(venv / "bin") in folders, "the folders it adds to take the layer's time"
    assert str(site.parent) not in folders and str(venv / "lib") not in folders, "folders passed through are left alone"
    assert not any("__pycache__" in member.name for member in members), "no bytecode, as the image has none"


def tree(root: Path, group_like_user: bool = False) -> dict[str, tuple]:
    """Each file below root: its mode (with group_like_user, the group's bits set as the user's, as the build does)
    and its bytes."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or path.is_dir():
            continue
        mode = path.stat().st_mode & 0o7777
        found[str(path.relative_to(root))] = ((mode & ~0o070) | ((mode & 0o700) >> 3) if group_like_user else mode,
                                              path.read_bytes())
    return found


def test_the_server_unpacks_only_the_wheels_it_serves(tmp_path):
    wheel = make_full_wheel(tmp_path / "wheels")
    venv = {"root": "/opt/venv", "site": "/opt/venv/lib/python3.11/site-packages", "interpreter": "/opt/venv/bin/python3",
            "python": "3.11", "script_template": "from %(module)s import %(import_name)s\n%(func)s()\n", "uid": 1000,
            "gid": 0, "time": 946684800}
    not_a_wheel = make_wheel(tmp_path / "wheels", "not_a_wheel", "1.0")  # METADATA, but no WHEEL file nor RECORD
    with BuildInputsServer({wheel.name: wheel, not_a_wheel.name: not_a_wheel}, "", None, TOKEN) as served:
        base = f"http://{served.address}:{BUILD_INPUTS_PORT}"

        def post(wheels) -> bytes:
            request = urllib.request.Request(f"{base}/layer.tar", json.dumps({"wheels": wheels, "venv": venv}).encode(),
                                             headers={"Authorization": basic_authorization(TOKEN)})
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.read()

        with tarfile.open(fileobj=io.BytesIO(post([[wheel.name, False]]))) as tar:
            names = tar.getnames()
        assert "opt/venv/bin/demo" in names and "opt/venv/lib/python3.11/site-packages/demo_pkg/__init__.py" in names
        assert not any(name.endswith("REQUESTED") for name in names), "a dependency is not marked REQUESTED"
        for refused in ([["../../etc/passwd", True]], [["other-1.0-py3-none-any.whl", True]], "not a list",
                        [[not_a_wheel.name, True]]):
            with pytest.raises(urllib.error.HTTPError) as error:
                post(refused)
            assert error.value.code == 400 and error.value.read().startswith(b"no layer: ")


# ---------------------------------------------------------------------------------------- on the engine

def test_secrets_never_reach_the_final_image(engine_env, docker_client, wheelhouse, tmp_path, tmp_path_factory):
    """A CA bundle and an index token given to a build are in no layer and no history entry."""
    ca_marker, token_marker = "CA-MARKER-5f1e2d", "TOKEN-MARKER-9a8b7c"
    ca_bundle = tmp_path / "corporate-ca.pem"
    ca_bundle.write_text(f"-----BEGIN CERTIFICATE-----\n{ca_marker}\n-----END CERTIFICATE-----\n")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", "localhost:5000/test/secrets"))
    with_live_compat(matrix)
    reports = tmp_path / "reports"
    with one_process_at_a_time(tmp_path_factory, SHARED_STEPS):  # a prune of the stages would pull them from under it
        run_cli("--matrix", str(matrix), "--reports", str(reports), "build", "2.13.0-cpu-runtime",
                "--wheelhouse", str(wheelhouse), "--ca-bundle", str(ca_bundle),
                "--pip-index-url", f"https://ci:{token_marker}@mirror.example.com/simple", check_exit=0)
    image = docker_client.images.get("localhost:5000/test/secrets:2.13.0-cpu-runtime")
    history = json.dumps(image.history()) + json.dumps(image.attrs)
    assert ca_marker not in history and token_marker not in history
    assert "mirror.example.com" not in history
    assert TOKEN_HOST_SUFFIX not in history, "the build-input server's token is in the history or the config"
    for member_name, content in image_layer_files(image):
        assert ca_marker.encode() not in content, f"CA bundle found in layer file {member_name}"
        assert token_marker.encode() not in content, f"token found in layer file {member_name}"
        assert TOKEN_HOST_SUFFIX.encode() not in content, f"the server's token found in layer file {member_name}"
    docker_client.images.remove(image.id, force=True)


def image_layer_files(image):
    """Every regular file of every layer of an image (from `docker save`)."""
    with tempfile.TemporaryFile() as saved:
        for chunk in image.save(named=False):
            saved.write(chunk)
        saved.seek(0)
        with tarfile.open(fileobj=saved) as outer:
            for layer in (m for m in outer.getmembers() if m.name.endswith(".tar") or "/blobs/" in m.name):
                data = outer.extractfile(layer)
                if data is None:
                    continue
                try:
                    inner = tarfile.open(fileobj=data)
                except tarfile.ReadError:
                    continue
                for member in inner.getmembers():
                    if member.isfile() and member.size < 50_000_000:
                        yield member.name, inner.extractfile(member).read()


def test_the_planner_brings_its_bytecode_and_pip_runs_from_it(tmp_path):
    """Issue 58's cold build: a layer step cannot write bytecode into the planner's zip, so each of its plans compiled
    the pip it imported. Every module now comes with its unchecked-hash bytecode beside it, which zipimport takes on
    an interpreter of this magic number; pip runs from the zip and says it imported its bytecode."""
    (tmp_path / "planner.zip").write_bytes(planner_zip())
    names = set(zipfile.ZipFile(tmp_path / "planner.zip").namelist())
    sources = {name for name in names if name.endswith(".py")}
    assert sources and {name[:-3] + ".pyc" for name in sources} <= names
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "planner.zip"), PYTHONDONTWRITEBYTECODE="1")
    ran = subprocess.run([sys.executable, "-c", "import pip, pip._internal.commands.install as i; "
                          "print(pip.__file__, i.__file__)"], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert ran.stdout.split() == [f"{tmp_path}/planner.zip/pip/__init__.pyc",
                                  f"{tmp_path}/planner.zip/pip/_internal/commands/install.pyc"]
    assert subprocess.run([sys.executable, "-m", "pip", "--version"], env=env, capture_output=True, text=True, check=True,
                          cwd=tmp_path).stdout.startswith("pip ")
