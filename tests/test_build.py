"""The builder on a real Docker engine: CPU rows from a wheelhouse, skip-unchanged, isolation, secrets."""
import json
import os
import re
from pathlib import Path

import docker
import pytest

from torchimages.build.builder import INPUT_HASH_LABEL
from torchimages.build.reproducible import INLINE_CACHE_KEY, saved_config, stored_config
from torchimages.build_inputs.container import BuildInputsContainer, ServerFailed
from torchimages.project import DEFAULT_TEMPLATES

from .build_fixtures import build_input_servers_left, tiny_matrix
from .conftest import (
    CPU_SELECTOR,
    ROOT,
    SHARED_STEPS,
    interruptible,
    one_process_at_a_time,
    run_cli,
    wait_until,
    with_live_compat,
)

pytestmark = pytest.mark.engine


def test_cpu_rows_build_with_their_labels_python_and_torch(docker_client, cpu_images):
    for tag, name in cpu_images.items():
        image = docker_client.images.get(name)
        labels = image.labels
        assert labels["io.torchimages.torch"] == "2.13.0"
        assert labels["io.torchimages.python"] == "3.11"
        assert labels["io.torchimages.flavor"] == tag.rsplit("-", 1)[1]
        assert labels["org.opencontainers.image.version"] == tag
        assert len(labels[INPUT_HASH_LABEL]) == 32
        output = docker_client.containers.run(
            name, ["python", "-c", "import sys, torch; print(torch.__version__, sys.version.split()[0])"], remove=True
        ).decode()
        torch_version, python_version = output.split()
        assert torch_version == "2.13.0+cpu"
        assert python_version.startswith("3.11.")


def test_both_flavors_have_a_compiler_and_only_devel_has_build_tools(docker_client, cpu_images):
    """torch.compile builds C++ at run time, so runtime images carry g++ too; make and ninja are devel's."""
    def has(image: str, program: str) -> bool:
        command = ["sh", "-c", f"command -v {program} >/dev/null && echo yes || echo no"]
        return docker_client.containers.run(image, command, remove=True).decode().strip() == "yes"

    assert has(cpu_images["2.13.0-cpu-devel"], "g++") and has(cpu_images["2.13.0-cpu-runtime"], "g++")
    assert has(cpu_images["2.13.0-cpu-devel"], "ninja")
    assert not has(cpu_images["2.13.0-cpu-runtime"], "ninja")


def test_second_run_skips_both_and_reports_it(cpu_images, wheelhouse, tmp_path):
    result = run_cli("--reports", str(tmp_path), "build", CPU_SELECTOR, "--wheelhouse", str(wheelhouse), check_exit=0)
    report = json.loads((tmp_path / "build-report.json").read_text())
    assert {entry["tag"]: entry["status"] for entry in report["images"]} == {tag: "skipped" for tag in cpu_images}
    assert all(entry["image_id"].startswith("sha256:") for entry in report["images"])
    # said "up to date" with its image id: "skipped" is what a check not run says
    assert all(f"{tag}: up to date (sha256:" in result.stdout + result.stderr for tag in cpu_images)


def test_changed_input_is_rebuilt(cpu_images, wheelhouse, tmp_path, docker_client):
    """Same row, other build args: the input hash differs, so the image is rebuilt, not skipped."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", "localhost:5000/test/changed"))
    with_live_compat(matrix)

    def build(*extra: str) -> str:
        reports = tmp_path / f"reports{len(extra)}"
        run_cli("--matrix", str(matrix), "--reports", str(reports), "build", "2.13.0-cpu-runtime",
                "--wheelhouse", str(wheelhouse), *extra, check_exit=0)
        [entry] = json.loads((reports / "build-report.json").read_text())["images"]
        return entry["status"]

    build()
    assert build("--jobs", "1") == "skipped"
    assert build("--extra-index-url", "https://mirror.invalid/simple") == "built"
    docker_client.images.remove("localhost:5000/test/changed:2.13.0-cpu-runtime", force=True)


def venv_stage_step(build_log: str) -> tuple[bool, str]:
    """(taken from the cache, resulting image id) of the venv stage's step that makes the venv."""
    step = next(text for text in build_log.split("\nStep ") if " -m venv " in text.split("\n")[0])
    return " ---> Using cache" in step, step.split(" ---> ")[-1].split()[0]


def test_a_rebuild_takes_the_build_stages_from_the_cache_unless_they_are_pruned(cpu_images, wheelhouse, tmp_path,
                                                                                docker_client, tmp_path_factory):
    """The build stages' images stay in the engine (the venv stage's own layers are about 13 MB): a rebuild takes
    them from the cache instead of running their apt and venv steps again (about 16 s a row here, in every rebuild
    after a change). `--prune-build-stages` removes them after the run."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", "localhost:5000/test/stages"))
    with_live_compat(matrix)

    def build(*extra: str) -> tuple[bool, str]:
        run_cli("--matrix", str(matrix), "--reports", str(tmp_path / "reports"), "build", "2.13.0-cpu-runtime",
                "--wheelhouse", str(wheelhouse), "--force", *extra, check_exit=0)
        return venv_stage_step((tmp_path / "reports" / "2.13.0-cpu-runtime" / "build.log").read_text())

    with one_process_at_a_time(tmp_path_factory, SHARED_STEPS):  # its last build makes the venv stage again
        build()
        cached, stage_image = build("--prune-build-stages")
        assert cached, "the venv stage of the run before was not kept"
        with pytest.raises(docker.errors.ImageNotFound):  # --prune-build-stages removed it
            docker_client.images.get(stage_image)
        cached, rebuilt_stage = build()
    # Not taken from the cache, unless a build on the engine tests' other process made that stage again meanwhile:
    # whichever it is, it is not the pruned one.
    assert rebuilt_stage != stage_image, "the pruned venv stage was still in the cache"
    docker_client.images.remove("localhost:5000/test/stages:2.13.0-cpu-runtime", force=True)


def test_the_venv_is_one_tree_with_one_owner_mode_and_file_time(cpu_images, docker_client):
    """Issue 20: /opt/venv, written in layers (torch, then the rest, for a CPU row), is one tree with one owner, mode
    g=u and one file time. (That a no-cache build gives the very same layers, and the devel row shares the runtime's,
    is test_reproducible_build's: one no-cache build serves both.)"""
    name = cpu_images["2.13.0-cpu-runtime"]
    listing = docker_client.containers.run(name, ["sh", "-c", "find /opt/venv -printf '%Ts %u %g\\n' | sort -u; "
                                                  "find /opt/venv ! -type l ! -perm -g+w -print"], remove=True).decode()
    assert listing.split("\n")[:-1] == ["946684800 torch root"], listing[:2000]


START_WITHOUT_COMPILING = """
import importlib.util, os, sys, time
started = time.perf_counter()
import torch
x = torch.randn(64, 64); (x @ x).sum().item()
seconds = time.perf_counter() - started
sources = [m.__file__ for m in list(sys.modules.values())
           if (getattr(m, "__file__", None) or "").startswith("/opt/venv/") and m.__file__.endswith(".py")]
missing = [path for path in sources if not os.path.exists(importlib.util.cache_from_source(path))]
flags = {int.from_bytes(open(importlib.util.cache_from_source(path), "rb").read(8)[4:8], "little")
         for path in sources if path not in missing}
print(len(sources), len(missing), sorted(flags), round(seconds, 2), missing[:3])
"""


def test_a_start_on_a_read_only_root_as_an_arbitrary_uid_compiles_nothing(cpu_images, docker_client):
    """Issue 58, item 5: the bytecode of every venv module `import torch` and a first op load was compiled at build
    time, as checked-hash pyc files (PEP 552 flags 0b11: the same bytes every build; the source's hash checked, so an
    edit of a module in a derived image is run, not the pyc), so a start where nothing can be written (a read-only
    root filesystem, an arbitrary uid) compiles none of them again. (That the pyc files have the venv's owner, mode and time is the test above's.)"""
    name = cpu_images["2.13.0-cpu-runtime"]
    answer = docker_client.containers.run(name, ["python", "-c", START_WITHOUT_COMPILING], read_only=True,
                                          user="4242:0", remove=True).decode()
    modules, missing, flags, _, examples = answer.strip().rsplit("\n", 1)[-1].split(" ", 4)
    assert int(modules) > 500 and (missing, flags) == ("0", "[3]"), answer


def test_a_server_that_cannot_start_on_the_engine_fails_the_build_and_leaves_nothing(docker_client, engine_env,
                                                                                      tmp_path):
    """The python stage's image without that Python (here the bare base): the server's exit is the error, and the
    container and network made for it are removed."""
    with pytest.raises(ServerFailed, match="the build-input server could not start in image debian:bookworm .*python3.11.* not found"):
        with BuildInputsContainer(docker_client.api, "debian:bookworm", "python3.11", {}, "", None, "t",
                                  serves=str(tmp_path / "build.log")):
            pytest.fail("the server should not have started")
    assert build_input_servers_left(docker_client, tmp_path) == ([], [])


def test_a_broken_dockerfile_fails_only_its_own_image(engine_env, tmp_path):
    matrix = tiny_matrix(tmp_path)
    images = tmp_path / "images"
    for tag, body in {"2.13.0-cpu-runtime": "RUN echo building fine", "2.12.0-cpu-runtime": "RUN echo about to break && exit 3"}.items():
        (images / tag).mkdir(parents=True)
        (images / tag / "Dockerfile").write_text(f"FROM debian:bookworm\n{body}\nLABEL io.torchimages.torch=x\n")
    reports = tmp_path / "reports"
    result = run_cli("--matrix", str(matrix), "--images", str(images), "--reports", str(reports), "build", "--jobs", "2",
                     "--force")
    assert result.returncode == 1
    report = {entry["tag"]: entry for entry in json.loads((reports / "build-report.json").read_text())["images"]}
    assert report["2.13.0-cpu-runtime"]["status"] == "built"
    assert report["2.12.0-cpu-runtime"]["status"] == "failed"
    assert "about to break" in report["2.12.0-cpu-runtime"]["error"], "the error shows the last log lines"
    assert "returned a non-zero code: 3" in result.stderr
    assert str(reports / "2.12.0-cpu-runtime" / "build.log") in result.stderr


def test_unreachable_engine_is_exit_2_with_what_to_do(tmp_path):
    result = run_cli("--reports", str(tmp_path), "build", CPU_SELECTOR,
                     env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert result.returncode == 2
    assert "no Docker engine answers" in result.stderr and "make engine" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_selector_and_missing_wheelhouse_are_exit_2(tmp_path):
    assert "no-such-tag" in run_cli("--reports", str(tmp_path), "build", "no-such-tag", check_exit=2).stderr
    result = run_cli("--reports", str(tmp_path), "build", CPU_SELECTOR, "--wheelhouse", str(tmp_path / "missing"))
    assert result.returncode == 2 and "--wheelhouse" in result.stderr


def test_no_intermediate_containers_are_left(docker_client, engine_env, tmp_path):
    """A build leaves none of its RUN containers behind (counted only for this build: the engine may be shared)."""
    matrix = tiny_matrix(tmp_path)
    images = tmp_path / "images"
    token = f"torchimages-leftover-test-{os.getpid()}"
    (images / "2.13.0-cpu-runtime").mkdir(parents=True)
    (images / "2.13.0-cpu-runtime" / "Dockerfile").write_text(f"FROM debian:bookworm\nRUN echo {token}\n")
    run_cli("--matrix", str(matrix), "--images", str(images), "--reports", str(tmp_path / "reports"), "build",
            "2.13.0-cpu-runtime", "--no-cache", check_exit=0)
    # sparse: listed without inspecting each, since other builds' containers come and go meanwhile
    leftovers = [c.short_id for c in docker_client.containers.list(all=True, sparse=True)
                 if token in c.attrs.get("Command", "")]
    assert leftovers == []


def sleeping_builds(tmp_path: Path, python_image: str, token: str, inputs_server: str, *extra: str,
                    run_step: str = ": step 3/"):
    """build.py building two rows whose RUN step sleeps, started as a user would; returned once both steps run (the
    progress line run_step says so)."""
    import subprocess
    import sys
    import time

    matrix = tiny_matrix(tmp_path)
    images = tmp_path / "images"
    for tag in ("2.13.0-cpu-runtime", "2.12.0-cpu-runtime"):
        (images / tag).mkdir(parents=True)
        # A python stage (with the row's Python 3.11) for the server on the engine to run in.
        (images / tag / "Dockerfile").write_text(f"FROM {python_image} AS python\nFROM python\n"
                                                 f"RUN echo {token} {tag} && sh -c 'sleep 600; : {token}'\n")
    command = [sys.executable, str(ROOT / "build.py"), "--matrix", str(matrix), "--images", str(images),
               "--reports", str(tmp_path / "reports"), "build", "--jobs", "2", "--no-cache",
               "--inputs-server", inputs_server, *extra]
    process = interruptible(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    running = 0
    while running < 2 and time.monotonic() < deadline:
        line = process.stderr.readline()
        running += run_step in line
    if running < 2:
        process.kill()
        pytest.fail("both builds should have reached their RUN step")
    return process


@pytest.mark.parametrize("inputs_server", ["loopback", "container"])
def test_ctrl_c_stops_builds_and_removes_their_containers(inputs_server, cpu_images, docker_client, tmp_path):
    """Also the build-input servers' containers and networks on the engine, where they run there."""
    import signal
    import subprocess

    token = f"torchimages-ctrl-c-test-{os.getpid()}"  # finds this test's containers, whatever else the engine runs

    def sleepers():  # listed without inspecting each: another run's container may go in between (a 404)
        return [c for c in docker_client.api.containers(all=True) if token in c["Command"]]

    process = sleeping_builds(tmp_path, cpu_images["2.13.0-cpu-runtime"], token, inputs_server)
    wait_until(lambda: len([c for c in sleepers() if c["State"] == "running"]) == 2, "both RUN containers running")
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("Ctrl-C did not stop the build within 120 s")
    assert process.returncode == 130
    # The interrupted build's log is kept beside build.log (none here: no build of the row finished before), and the
    # run says what each row has now.
    row = tmp_path / "reports" / "2.13.0-cpu-runtime"
    assert token in (row / "build.interrupted.log").read_text() and not (row / "build.log").exists()
    assert "build interrupted: " in process.stderr.read()
    # The engine removes a cancelled build's RUN container itself, just after the client goes.
    wait_until(lambda: not sleepers(), "the cancelled builds' containers being removed", timeout_s=60)
    assert build_input_servers_left(docker_client, tmp_path) == ([], [])


def step_processes(token: str) -> list[int]:
    """The processes of this host whose command line holds token: BuildKit runs a step's command with runc, not in a
    container the engine lists, and the project's engine runs on this host. (dash execs the last command of
    `sh -c`: a step's own `sh -c '...; : token'` stays to be found.)"""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # ended while listed
    return found


def test_ctrl_c_stops_buildkit_builds_and_their_steps(cpu_images, tmp_path):
    """With `--builder buildkit` the builder cancels each build by its id: the steps' processes end and no server is
    left on the engine."""
    import signal
    import subprocess

    token = f"torchimages-buildkit-ctrl-c-{os.getpid()}"
    process = sleeping_builds(tmp_path, cpu_images["2.13.0-cpu-runtime"], token, "loopback", "--builder", "buildkit",
                              run_step=": step 1/1")  # BuildKit numbers a stage's own steps: [stage-1 1/1] RUN
    try:
        wait_until(lambda: len(step_processes(token)) >= 2, "both RUN steps running")
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("Ctrl-C did not stop the BuildKit builds within 120 s")
    finally:
        process.kill()
    assert process.returncode == 130
    wait_until(lambda: not step_processes(token), "the cancelled steps' processes ending", timeout_s=60)


def test_buildkit_writes_the_very_venv_layers_of_the_classic_builder(cpu_images, wheelhouse, tmp_path, docker_client):
    """Issue 27: `--builder buildkit`, without the cache, writes the CPU runtime row's venv layers with the very diff
    ids the classic builder's image has (so a switch of builder uploads none of them again, and the same wheels give
    the same layers), while its other RUN steps really ran again; the devel row then shares every runtime layer below
    its own. Docker 20.10's BuildKit left the build's time on /etc in each RUN layer until the mount-points stage
    brought /etc/hosts and /etc/resolv.conf, and in its inline cache's createdAt until the settling (issue 47): a
    second no-cache build gives the very image. The wheels come from the build-input server on the engine: BuildKit's
    steps join no container's network, so it serves on a loopback address of the engine's host, and is gone
    afterwards."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", "localhost:5000/test/bk"))
    with_live_compat(matrix)
    build = ("--matrix", str(matrix), "--reports", str(tmp_path / "reports"), "build", "--builder", "buildkit",
             "--wheelhouse", str(wheelhouse), "--inputs-server", "container")
    # From an empty BuildKit cache: after no-cache builds it holds several layers for one step, and two flavors may
    # take different ones (only this test builds with BuildKit).
    docker_client.api.prune_builds(all=True)
    try:
        run_cli(*build, "2.13.0-cpu-runtime", "--no-cache", check_exit=0)
        assert build_input_servers_left(docker_client, tmp_path) == ([], [])
        log = (tmp_path / "reports" / "2.13.0-cpu-runtime" / "build.log").read_text()
        assert "] RUN /opt/venv/bin/python -c 'import sys, urllib.request;" in log and "DONE" in log  # plain progress
        run_cli(*build, "2.13.0-cpu-devel", check_exit=0)
        runtime, devel = (docker_client.api.inspect_image(f"localhost:5000/test/bk:{tag}")["RootFS"]["Layers"]
                          for tag in ("2.13.0-cpu-runtime", "2.13.0-cpu-devel"))
        classic = docker_client.api.inspect_image(cpu_images["2.13.0-cpu-runtime"])["RootFS"]["Layers"]
        # The classic image: [..., RUN useradd, COPY the venv's own files, RUN torch, RUN the rest, COPY entrypoint,
        # RUN the OS security upgrade]. BuildKit's may end with an empty layer more (its WORKDIR); devel adds its
        # toolchain above the entrypoint, then its own OS security layer.
        venv_layers = classic[-5:-2]
        assert venv_layers[0] in runtime, "the venv's own files: the classic builder's very bits"
        start = runtime.index(venv_layers[0])
        assert runtime[start:start + 3] == venv_layers, "the venv layers: the classic builder's very bits"
        runs, cached = (set(re.findall(pattern, log, re.MULTILINE)) for pattern in (r"^(#\d+) \[[^\]]+\] RUN ",
                                                                                   r"^(#\d+) CACHED$"))
        assert runs and not runs & cached, "the no-cache BuildKit build really ran the RUN steps again"
        assert devel[:start + 4] == runtime[:start + 4], "devel shares the runtime layers up to the entrypoint's"
        first = settled_config_of(docker_client, "localhost:5000/test/bk:2.13.0-cpu-runtime")
        assert stored_config(docker_client.api, docker_client.api.inspect_image(
            "localhost:5000/test/bk:2.13.0-cpu-runtime")["Id"]) == first, "settled from the store, inline cache and all"
        run_cli(*build, "2.13.0-cpu-runtime", "--no-cache", "--force", check_exit=0)
        second = settled_config_of(docker_client, "localhost:5000/test/bk:2.13.0-cpu-runtime")
        # Every layer and the whole config again, but BuildKit's inline cache: its records are the engine's cache
        # graph, which the devel build in between grew (docs/reproducible.md).
        assert second["rootfs"] == first["rootfs"], "two no-cache BuildKit builds of the same inputs gave other layers"
        assert {**second, INLINE_CACHE_KEY: ""} == {**first, INLINE_CACHE_KEY: ""}
    finally:
        for tag in ("2.13.0-cpu-runtime", "2.13.0-cpu-devel"):
            docker_client.images.remove(f"localhost:5000/test/bk:{tag}", force=True)
        docker_client.api.prune_builds(all=True)


def settled_config_of(docker_client, image: str) -> dict:
    return saved_config(docker_client.api.get_image(image))


def test_a_killed_builder_leaves_no_server_container_on_the_engine(cpu_images, docker_client, tmp_path):
    """SIGKILL: the builder cleans up nothing. Its servers' standard input (held by the builder) closes, they exit and
    the engine removes them with their uploaded wheels; only their empty networks stay, as the module says."""
    token = f"torchimages-kill-test-{os.getpid()}"
    process = sleeping_builds(tmp_path, cpu_images["2.13.0-cpu-runtime"], token, "container")
    containers, networks = build_input_servers_left(docker_client, tmp_path)
    assert len(containers) == 2 and len(networks) == 2
    process.kill()
    process.wait(timeout=60)
    wait_until(lambda: not build_input_servers_left(docker_client, tmp_path)[0], "the servers' containers being removed",
               timeout_s=60)
    wait_until(lambda: not [c for c in docker_client.api.containers(all=True) if token in c["Command"]],
               "the killed builds' RUN containers being removed", timeout_s=60)
    for network in networks:
        docker_client.api.remove_network(network)


def test_report_keeps_the_last_real_build_time_across_skipped_runs(tmp_path):
    from torchimages.build.builder import BuildResult, write_report

    write_report(tmp_path, [BuildResult("a", "built", duration=420.0), BuildResult("b", "failed", duration=3.0)])
    path = write_report(tmp_path, [BuildResult("a", "skipped", duration=0.0)])
    entries = {entry["tag"]: entry for entry in json.loads(path.read_text())["images"]}
    assert entries["a"]["status"] == "skipped" and entries["a"]["last_build_duration"] == 420.0
    assert entries["b"]["last_build_duration"] == 0.0, "a failed build says nothing about build time"


def test_without_a_wheelhouse_the_build_installs_from_the_index(engine_env, tmp_path):
    """No --wheelhouse: pip must look in --pip-index-url (here a port where nothing listens), and the build-input
    server offers it no wheels."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", "localhost:5000/test/noindex"))
    with_live_compat(matrix)
    reports = tmp_path / "reports"
    index = "http://127.0.0.1:9/simple"
    result = run_cli("--matrix", str(matrix), "--reports", str(reports), "build", "2.13.0-cpu-runtime",
                     "--pip-index-url", index, "--extra-index-url", index)
    assert result.returncode == 1
    log = (reports / "2.13.0-cpu-runtime" / "build.log").read_text()
    assert f"Looking in indexes: {index}" in log
    assert "Looking in links:" not in log


def test_the_user_survives_a_base_that_already_has_its_uid(docker_client, engine_env, tmp_path):
    """ubuntu:24.04 (and so nvidia/cuda:*-ubuntu24.04) ships a user `ubuntu` with uid 1000: the template's user
    step, rendered for real, must still give uid 1000 to the row's user."""
    import jinja2

    from torchimages.model import User

    macros = jinja2.Environment(loader=jinja2.FileSystemLoader(str(DEFAULT_TEMPLATES)),
                                undefined=jinja2.StrictUndefined).get_template("macros.j2").module
    (tmp_path / "Dockerfile").write_text(
        "FROM debian:bookworm\n"
        "RUN useradd --create-home --uid 1000 --shell /bin/bash ubuntu\n"
        f"{macros.non_root_user(User('torch', 1000))}\n")
    image, _ = docker_client.images.build(path=str(tmp_path), tag="torchimages-test/uid-taken:latest", rm=True, forcerm=True)
    try:
        output = docker_client.containers.run(image.id, ["sh", "-c", "id -un 1000; echo $HOME; ls /home"],
                                              user="1000", remove=True).decode().split()
        assert output == ["torch", "/home/torch", "torch"]
    finally:
        docker_client.images.remove(image.id, force=True)
