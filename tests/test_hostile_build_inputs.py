"""The build-input server and the install script it serves, tried as an attacker would (issue 45's fifth hostile-input
round; docs/hostile-input.md, "The new code"): wheel members outside their scheme folder, bad CRCs, unbounded request
bodies, another local user, and the token in no_proxy.

Nothing here needs an engine or leaves this machine. A test that could hang on today's code runs under an alarm, so it
fails instead.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .hostile_fixtures import within

LAYER_VENV = {"root": "/opt/venv", "site": "/opt/venv/lib/python3.11/site-packages",
              "interpreter": "/opt/venv/bin/python3", "python": "3.11",
              "script_template": "from %(module)s import %(import_name)s\n%(func)s()\n", "uid": 1000, "gid": 0,
              "time": 946684800}


def hostile_wheel(folder: Path, members: dict[str, bytes], name: str = "demo_pkg") -> Path:
    import zipfile
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.replace('/', '_')}-1.0-py3-none-any.whl"
    files = {"demo_pkg-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n", "demo_pkg-1.0.dist-info/RECORD": b"",
             **members}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for member, body in files.items():
            archive.writestr(member, body)
    return path


def layer_of(wheel: Path) -> bytes:
    import io

    from torchimages.build_inputs.unpack import LayerWheel, Venv, read_wheels, unpack
    venv = Venv(**LAYER_VENV)
    read = read_wheels([LayerWheel(wheel, True)], venv)  # validation: before a byte is sent
    out = io.BytesIO()
    unpack(read, venv, out)
    return out.getvalue()


@pytest.mark.parametrize(("members", "name", "said"), [
    ({"/etc/cron.d/owned": b"* * * * * root sh\n"}, "demo_pkg", "outside its folder"),
    ({"demo_pkg/../../../../../etc/passwd": b"x"}, "demo_pkg", "outside its folder"),
    ({"demo_pkg-1.0.data/data/../../../../etc/x": b"x"}, "demo_pkg", "outside its folder"),
    ({"demo_pkg-1.0.data/elsewhere/x": b"x"}, "demo_pkg", "not a scheme folder"),
    ({"demo_pkg-1.0.data/headers/x.h": b"x"}, "../../../../etc", "not a project name"),
    ({"demo_pkg-1.0.dist-info/entry_points.txt": b"[console_scripts]\n../../../etc/x = demo_pkg:main\n"}, "demo_pkg",
     "not a file name"),
])
def test_wheel_members_are_confined_to_their_scheme_folder(tmp_path, members, name, said):
    from torchimages.build_inputs.unpack import WheelError
    with pytest.raises(WheelError) as refused:
        layer_of(hostile_wheel(tmp_path, members, name))
    assert said in str(refused.value)


def damaged_wheel(folder: Path) -> Path:
    wheel = hostile_wheel(folder, {"demo_pkg/__init__.py": b"MARKER-" + b"a" * 100})
    wheel.write_bytes(wheel.read_bytes().replace(b"MARKER-", b"MARKED-"))  # stored: the bytes change, the CRC does not
    return wheel


def test_a_wheel_with_a_bad_crc_never_makes_a_whole_layer(tmp_path):
    """The CRCs are checked as the members are unpacked (issue 58: a check before the stream inflated every wheel
    twice): the damaged member is a WheelError naming the wheel, and the tar written up to it has no end."""
    import io

    from torchimages.build_inputs.unpack import LayerWheel, Venv, WheelError, read_wheels, unpack
    wheel = damaged_wheel(tmp_path)
    venv = Venv(**LAYER_VENV)
    out = io.BytesIO()
    with pytest.raises(WheelError) as refused:
        unpack(read_wheels([LayerWheel(wheel, True)], venv), venv, out)
    assert "CRC" in str(refused.value) and wheel.name in str(refused.value)
    assert not out.getvalue().endswith(bytes(1024)), "the tar's end was written after the damaged member"


def test_a_layer_cut_short_by_a_damaged_wheel_is_refused_by_the_step_with_the_server_s_reason(tmp_path):
    """Over HTTP: the server sends a layer in chunks and ends it with the last one only when it is whole. A stream
    cut short (here by a damaged member) is refused by the step's reader, which asks the server why, where a tar cut
    at a member's end would have extracted without a word; a whole layer reads to its end."""
    import io
    import tarfile
    import urllib.request

    from torchimages.build_inputs import install_layer
    from torchimages.build_inputs.server import BUILD_INPUTS_PORT, TOKEN_HOST_SUFFIX, BuildInputsServer
    damaged = damaged_wheel(tmp_path / "damaged")
    good = hostile_wheel(tmp_path / "good", {"demo_pkg/__init__.py": b"print('hello')\n"})
    token = "c" * 48
    with BuildInputsServer({"damaged.whl": damaged, "good.whl": good}, "", None, token) as served, within(30):
        url = f"http://{served.address}:{BUILD_INPUTS_PORT}"
        install_layer.authorize({"no_proxy": token + TOKEN_HOST_SUFFIX})
        try:
            said = {}
            for name in ("good.whl", "damaged.whl"):
                post = urllib.request.Request(url + "/layer.tar", data=json.dumps(
                    {"wheels": [[name, True]], "venv": LAYER_VENV}).encode(), headers={"Content-Type": "application/json"})
                sink = io.BytesIO()
                said[name] = (install_layer.receive_layer(url, post, sink), sink.getvalue())
        finally:
            urllib.request.install_opener(None)
    assert said["good.whl"][0] is None
    with tarfile.open(fileobj=io.BytesIO(said["good.whl"][1])) as layer:
        assert "opt/venv/lib/python3.11/site-packages/demo_pkg/__init__.py" in layer.getnames()
    assert "CRC" in said["damaged.whl"][0] and "damaged" in said["damaged.whl"][0]


def test_a_good_wheel_still_makes_its_layer(tmp_path):
    layer = layer_of(hostile_wheel(tmp_path, {"demo_pkg/__init__.py": b"", "demo_pkg-1.0.data/headers/x.h": b""}))
    assert b"opt/venv/include/site/python3.11/demo_pkg/x.h" in layer


@pytest.mark.parametrize("length", ["99999999999", "-1", "abc", None])
def test_request_bodies_are_bounded(tmp_path, length):
    import http.client

    from torchimages.build_inputs.server import BUILD_INPUTS_PORT, BuildInputsServer, basic_authorization
    with BuildInputsServer({}, "", None, "t" * 48) as served, within(20):
        connection = http.client.HTTPConnection(served.address, BUILD_INPUTS_PORT, timeout=10)
        connection.putrequest("POST", "/layer.tar")
        connection.putheader("Authorization", basic_authorization("t" * 48))
        if length is not None:
            connection.putheader("Content-Length", length)
        connection.endheaders()
        answer = connection.getresponse()
        assert answer.status == 400 and b"Content-Length" in answer.read()


def test_another_local_user_reads_nothing_from_a_build_s_server(tmp_path):
    """The server's loopback address and port show in /proc/net/tcp: a local user (here uid 65534, nobody) asked it for
    pip's settings (the index login), the wheels, the planner and a layer. Without the build's token: 401 and no byte
    of any of them; the install script, the toolkit's published source, is all it serves to anyone."""
    from torchimages.build_inputs.server import BUILD_INPUTS_PORT, BuildInputsServer, basic_authorization

    from .build_fixtures import make_wheel
    wheel = make_wheel(tmp_path / "wheels", "private_pkg", "1.0", b"PRIVATE-CODE")
    token = "a1" * 24
    attempt = r"""
import json, sys, urllib.error, urllib.request
base, header = sys.argv[1], sys.argv[2]
answers = {}
for method, path in [("GET", "/inputs.json"), ("GET", "/wheels/"), ("GET", "/wheels/private_pkg-1.0-py3-none-any.whl"),
                     ("GET", "/wheels/private_pkg-1.0-py3-none-any.whl.metadata"), ("GET", "/planner.zip"),
                     ("POST", "/layer.tar"), ("GET", "/install_layer.py")]:
    request = urllib.request.Request(base + path, method=method, data=b"{}" if method == "POST" else None,
                                     headers={"Authorization": header} if header else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            answers[path] = [response.status, response.read().decode("latin-1")]
    except urllib.error.HTTPError as error:
        answers[path] = [error.code, error.read().decode("latin-1")]
print(json.dumps(answers))
"""
    with BuildInputsServer({wheel.name: wheel}, "[global]\nindex-url = https://ci:LOGIN-s3cret@mirror/simple\n",
                           None, token) as served, within(60):
        base = f"http://{served.address}:{BUILD_INPUTS_PORT}"
        for header in ("", basic_authorization("b2" * 24), "Basic " + "x" * 10_000):
            result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                                     "-S", "-c", attempt, base, header], capture_output=True, text=True, check=True)
            answers = json.loads(result.stdout)
            public = answers.pop("/install_layer.py")
            assert public[0] == 200 and "def main(" in public[1]
            assert {path: status for path, (status, _) in answers.items()} == dict.fromkeys(answers, 401)
            assert "LOGIN-s3cret" not in result.stdout and "PRIVATE-CODE" not in result.stdout
        result = subprocess.run([sys.executable, "-S", "-c", attempt, base, basic_authorization(token)],
                                capture_output=True, text=True, check=True)
        assert json.loads(result.stdout)["/inputs.json"][0] == 200 and "LOGIN-s3cret" in result.stdout


def test_the_install_script_sends_the_token_it_finds_in_no_proxy(tmp_path, monkeypatch):
    """The build's steps get the token in the predefined no_proxy arg (kept out of the history and the cache key);
    the install script sends it on every request, and stops in one line where a build gave none."""
    import urllib.request

    from torchimages.build_inputs import install_layer
    from torchimages.build_inputs.server import BUILD_INPUTS_PORT, BuildInputsServer, token_arg
    token = "c3" * 24
    monkeypatch.setattr(urllib.request, "_opener", None)  # install_opener's global: restored after the test
    with BuildInputsServer({}, "[global]\n", "PEM", token) as served, within(30):
        install_layer.authorize({"no_proxy": f"torchimages-build-inputs,proxy.corp,{token_arg(token)}"})
        env = install_layer.fetch_settings(f"http://{served.address}:{BUILD_INPUTS_PORT}", str(tmp_path))
        assert Path(env["PIP_CONFIG_FILE"]).read_text() == "[global]\n"
    with pytest.raises(SystemExit, match="no build-input token in no_proxy"):
        install_layer.authorize({"no_proxy": "torchimages-build-inputs"})


def test_a_request_nested_deeper_than_json_parses_is_answered_400(tmp_path):
    import http.client

    from torchimages.build_inputs.server import BUILD_INPUTS_PORT, BuildInputsServer, basic_authorization
    body = b"[" * 100_000 + b"]" * 100_000
    with BuildInputsServer({}, "", None, "t" * 48) as served, within(20):
        connection = http.client.HTTPConnection(served.address, BUILD_INPUTS_PORT, timeout=10)
        connection.request("POST", "/layer.tar", body, {"Authorization": basic_authorization("t" * 48)})
        answer = connection.getresponse()
        assert answer.status == 400 and b"RecursionError" in answer.read()
