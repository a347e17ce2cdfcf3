import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parent.parent
# The toolkit's tests run on a frozen project of their own (tests/project/README.md): the repository's live
# matrix.yaml and compat.yaml are data, checked by test_project_data.py alone.
FIXTURE_PROJECT = Path(__file__).parent / "project"
FIXTURE_MATRIX, FIXTURE_COMPAT = FIXTURE_PROJECT / "matrix.yaml", FIXTURE_PROJECT / "compat.yaml"


# Tests that use these fixtures need a Docker engine (or fetch wheels for one): the slow lane. `make test-fast`
# runs the rest, with no engine, in under a minute.
ENGINE_FIXTURES = {"engine_env", "wheelhouse", "cosign"}

# The engine tests run on two processes (`-n 2 --dist loadgroup`), each taking whole modules in their order: a serial
# lane keeps the machine's two cores about 60% busy (builds wait on the disk, verifications on one container). These
# modules run beside the others (the builds, publishing and logins): modules that share build stages (a test prunes
# them), BuildKit's cache (tests prune it) or local image names stay on one side (docs/benchmarks-log.md: the audit).
# The reproducible builds moved here (2026-11-29): the other side took 4,050 s of test time to this one's 2,080 (one
# run's durations, summed per side). The no-cache builds of the reproducible tests then run on the CUDA rows'
# process, before them, never between their runtime and devel builds. Then 2,003 s here to 1,852 s there on a warm
# engine, where CI's cold one adds the CUDA rows' build (about 320 s) here: the installed command's first day
# (about 100 s) went back.
BESIDE_THE_BUILDS = {"test_build_inputs.py", "test_cuda_images.py", "test_multiarch.py", "test_signing.py",
                     "test_verify.py", "test_reproducible_build.py"}
# Modules whose tests import torch in the test process (about 2 s of CPU, once per process): on one worker, not on each.
IMPORT_TORCH = {"test_gpu_simulation.py", "test_gpu_record.py"}


@pytest.hookimpl(optionalhook=True)  # a run without xdist (`-p no:xdist`, to debug one test) knows no such hook
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`, grouped by module: the engine-free lane (`-m "not engine"`) keeps the torch importers
    together, any other run every module in one of the two engine groups. (pytest-xdist 3.8 names a test's group in
    its node id, which pytest 9 no longer lets a plugin change: `xdist_group` marks do nothing here.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    engine_free = config.getoption("markexpr") == "not engine"

    def group_of(nodeid: str) -> str:
        module = Path(nodeid.split("::", 1)[0]).name
        if module in IMPORT_TORCH:
            return "imports-torch"
        if engine_free:
            return nodeid  # a group of its own
        return "beside-the-builds" if module in BESIDE_THE_BUILDS else "builds-and-publishing"

    class ModuleGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ModuleGroupScheduling(config, log)


# What the engine lane adds to the disk at its peak on a fresh clone: the wheels, the engine's images and layers, and
# publishing's temporary copies of images, the two processes' at once (measured with `df` every 20 s over three
# runs: 18.2 to 23.7 GB; then 30.7 GB on 2026-11-29, every 10 s, when the layout check of the two CUDA rows, verified
# side by side, held two `docker save` copies at once: one CI runner had 31.4 GB and its disk filled. One save at a
# time since (verify/image_layers.py); docs/benchmarks-log.md).
ENGINE_LANE_PEAK_DISK_BYTES = 26 * 10**9


def pytest_report_header(config):
    """The free disk, first thing in the log: a runner short of it fails late, with 'no space left on device'."""
    free = shutil.disk_usage(ROOT).free
    verdict = "" if free >= ENGINE_LANE_PEAK_DISK_BYTES else ": too little, engine tests will fail for want of disk"
    return (f"disk: {free / 1e9:.1f} GB free under {ROOT}; the engine tests need about "
            f"{ENGINE_LANE_PEAK_DISK_BYTES / 1e9:.0f} GB{verdict}")


def pytest_collection_modifyitems(items):
    for item in items:
        if ENGINE_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.engine)
    # The CUDA rows' module last: on its side of the engine lane it then builds while the other side is past the tests
    # that make new layers for the steps every row shares (SHARED_STEPS), which would otherwise wait for it.
    items.sort(key=lambda item: item.path.name == "test_cuda_images.py")


def run_cli(*args: str, check_exit: int | None = None, env=None, timeout=1800) -> subprocess.CompletedProcess:
    """Run build.py as a user would; returns the finished process (stdout/stderr as text)."""
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), *args], capture_output=True, text=True,
                            env=env, timeout=timeout, check=False)
    return exited_as(result, check_exit)


def run_cli_side_by_side(runs: dict[str, tuple[str, ...]], at_once: int = 2) -> dict[str, subprocess.CompletedProcess]:
    """Several build.py runs, two at a time: a verification's container keeps about one core busy, so two side by
    side take about 0.6 of their time one after the other (measured here: 70 s against 53 s + 69 s)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=at_once) as pool:
        futures = {name: pool.submit(run_cli, *args) for name, args in runs.items()}
        return {name: future.result() for name, future in futures.items()}


def exited_as(result: subprocess.CompletedProcess, check_exit: int | None) -> subprocess.CompletedProcess:
    if check_exit is not None:
        assert result.returncode == check_exit, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def run_cli_in_process(*args: str, check_exit: int | None = None, env: dict | None = None,
                       **_subprocess_only) -> subprocess.CompletedProcess:
    """build.py's main() in this process, for the many fast input tests (an interpreter start costs more than the
    command). Output and exit code as run_cli gives them; an exception that escapes main() is printed as the
    traceback a user would see, so `"Traceback" not in stderr` means the same here. env is added to this process's
    environment (run_cli's replaces it)."""
    import io
    import os
    import traceback
    from contextlib import redirect_stderr, redirect_stdout
    from unittest import mock

    from torchimages.cli import main
    from torchimages.invocation import CLONE

    stdout, stderr = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env or {}), redirect_stdout(stdout), redirect_stderr(stderr):
        try:
            code = main(list(args), program=CLONE)  # its messages name the command as build.py's do
        except SystemExit as stop:  # argparse's usage errors
            code = stop.code if isinstance(stop.code, int) else 1
        except Exception:  # noqa: BLE001 - shown as the traceback a user would see
            traceback.print_exc(file=stderr)
            code = 1
    return exited_as(subprocess.CompletedProcess(["build.py", *args], code, stdout.getvalue(), stderr.getvalue()),
                     check_exit)


def wait_until(condition, what: str, timeout_s: float = 120):
    """Synchronise on an event (a container exists, a process runs), not on a guess of how long it takes: poll the
    condition until it holds; fail naming what never happened. The bound only catches hangs."""
    import time

    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.1)
    return result


def with_live_compat(matrix: Path) -> Path:
    """The engine tests build this repository's live rows: a matrix they write elsewhere is checked against the live
    compatibility data, copied beside it."""
    shutil.copy(ROOT / "compat.yaml", matrix.with_name("compat.yaml"))
    return matrix


def copy_fixture_project(folder: Path) -> Path:
    """The fixture project's matrix and compatibility data copied into folder (made if missing); its matrix."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURE_COMPAT, folder / "compat.yaml")
    return Path(shutil.copy(FIXTURE_MATRIX, folder / "matrix.yaml"))


@pytest.fixture
def fixture_project(tmp_path) -> Path:
    """A scratch copy of the fixture project in tmp_path, with its images/ rendered as `build.py render` does."""
    matrix = copy_fixture_project(tmp_path)
    rendered = run_cli_in_process("--matrix", str(matrix), "--images", str(tmp_path / "images"),
                                  "--reports", str(tmp_path / "reports"), "render")
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    return tmp_path


@pytest.fixture
def compat_beside_tmp_matrix(tmp_path):
    """A matrix a test writes into tmp_path finds its compatibility data beside it, as a project's own does."""
    shutil.copy(FIXTURE_COMPAT, tmp_path / "compat.yaml")


@pytest.fixture
def engine_without_gpus(docker_client):
    """For tests of what happens on an engine that cannot give containers GPUs: skipped, saying so, on a GPU host."""
    from torchimages.peers import engine

    if engine.has_gpu_runtime(docker_client):
        pytest.skip("this engine has the NVIDIA runtime: the no-GPU behaviour cannot be seen here")
    return docker_client


@pytest.fixture
def cli():
    return run_cli


CPU_SELECTOR = "2.13.0-cpu-*"
# The CUDA rows CI builds from the real wheel set (PyPI's torch 2.14.1 is the cu130 build): runtime and devel, the
# x86_64 images by name (the row's `-arm64` images build under qemu here, beyond the engine lane's budget).
CUDA_RUNTIME, CUDA_DEVEL = "2.14.1-cuda13.0-cudnn9-runtime", "2.14.1-cuda13.0-cudnn9-devel"
CUDA_ROWS = (CUDA_RUNTIME, CUDA_DEVEL)


@pytest.fixture(scope="session")
def cosign():
    """The real cosign CLI that `make cosign` installs (the signing tests verify with it)."""
    from devtools.cosign import cosign_path

    found = cosign_path()
    assert found, "the signing tests need the real cosign CLI: run `make cosign` (python -m devtools.cosign)"
    return found


@pytest.fixture(scope="session", autouse=True)
def user_cache_folder(tmp_path_factory):
    """A user cache folder of this session's own, for the CLI runs too: publishing keeps its pushes' blob-info caches
    there (shared by the session's tests, as by a CI runner's nights), and never in the developer's."""
    import os

    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("user-cache"))


@pytest.fixture(scope="session")
def engine_env():
    """A real Docker engine (started by the project when none answers); exports DOCKER_HOST for the CLI."""
    import os

    from devtools.localengine import ensure_engine

    info = ensure_engine()
    os.environ["DOCKER_HOST"] = info.docker_host
    os.environ["TORCHIMAGES_REGISTRY"] = info.registry
    return info


@pytest.fixture(scope="session")
def docker_client(engine_env):
    from torchimages.peers import engine

    client = engine.client()
    yield client
    client.close()


# Builds that make new layers for the steps every row's Dockerfile shares (the `python` stage, the venv stage's apt
# step) take this lock, as the CUDA rows' build does: the engine's classic builder takes a cached step from the newest
# image that step made, so such a build between a CUDA row's runtime and devel builds parts the flavors' layers (seen
# once with the engine tests on two processes: the devel image shared only its base with the runtime). The secrets
# build takes it too: test_build's --prune-build-stages removed a stage image it was about to copy from (2026-11-29).
SHARED_STEPS = "builds-of-the-shared-steps"


@contextmanager
def one_process_at_a_time(tmp_path_factory, name: str):
    """A session fixture's work done by one test process at a time (the engine lane runs on two): the other waits,
    then finds it done (wheels fetched, images built and skipped as unchanged)."""
    shared = tmp_path_factory.getbasetemp().parent  # the run's, above each xdist worker's own
    with FileLock(shared / f"{name}.lock"):
        yield


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory):
    """Wheels for the CPU rows, fetched once on the host (the builds then need no index)."""
    path = ROOT / "wheelhouse"
    with one_process_at_a_time(tmp_path_factory, "wheelhouse"):
        if not list(path.glob("cpu-py3.11/torch-*.whl")):
            run_cli("wheels", CPU_SELECTOR, "--dest", str(path), "--pip-index-url", "https://pypi.org/simple",
                    check_exit=0)
    return path


@pytest.fixture(scope="session")
def cuda_wheelhouse(wheelhouse, tmp_path_factory):
    """The cu130 wheel set (about 3 GB), fetched once and shared by the runtime and devel rows."""
    with one_process_at_a_time(tmp_path_factory, "wheelhouse"):
        if not list(wheelhouse.glob("cu130-py3.11/torch-2.14.1-*.whl")):
            run_cli("wheels", *CUDA_ROWS, "--dest", str(wheelhouse), check_exit=0)
    return wheelhouse


def local_names(*selectors: str) -> dict[str, str]:
    from torchimages.build.builder import local_name
    from torchimages.matrix.load import load_matrix, select

    return {spec.tag: local_name(spec) for spec in select(load_matrix(ROOT / "matrix.yaml").specs, list(selectors))}


@pytest.fixture(scope="session")
def cpu_images(engine_env, wheelhouse, tmp_path_factory):
    """The CI-buildable rows, really built on the engine: {tag: local image name}."""
    with one_process_at_a_time(tmp_path_factory, SHARED_STEPS):
        result = run_cli("--reports", str(tmp_path_factory.mktemp("cpu-images")), "build", CPU_SELECTOR,
                         "--wheelhouse", str(wheelhouse), "--jobs", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    return local_names(CPU_SELECTOR)


def interruptible(command: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start build.py so that SIGINT reaches it as Ctrl-C would, even when this test run was started in the
    background (a shell starts background jobs with SIGINT ignored, and children inherit that)."""
    import signal

    return subprocess.Popen(command, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **popen_kwargs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def own_registry(tmp_path):
    """A registry process of this test's own (Debian's docker-registry), so the test may kill it."""
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(f'version: 0.1\nlog: {{level: error}}\nstorage:\n  filesystem: {{rootdirectory: "{tmp_path / "data"}"}}\n'
                      f'  delete: {{enabled: true}}\nhttp: {{addr: "127.0.0.1:{port}"}}\n')
    process = subprocess.Popen(["/usr/bin/docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    yield process, f"127.0.0.1:{port}"
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture
def fake_registry():
    """A registry API with two dated tags of ROW (so prune has one to delete) that records every DELETE (the hostile
    documents' and files' prune tests)."""
    import hashlib
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from .documents_fixtures import ROW

    deletes = []

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self):
            tags = {"name": "ml/pytorch", "tags": [f"{ROW}-20260101", f"{ROW}-20260102"]}
            self.answer(200, json.dumps(tags if self.path.endswith("/tags/list") else {}).encode())

        def do_HEAD(self):
            self.answer(200, b"", {"Docker-Content-Digest": "sha256:" + hashlib.sha256(self.path.encode()).hexdigest()})

        def do_DELETE(self):
            deletes.append(self.path)
            self.answer(202, b"")

        def answer(self, status: int, body: bytes, headers: dict | None = None) -> None:
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                                **(headers or {})}.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}/ml/pytorch", deletes
    server.shutdown()
    server.server_close()


@pytest.fixture
def host(request, tmp_path, monkeypatch):
    """The scenario's nvidia-smi first on PATH, its /proc/driver/nvidia/version and its libcuda's cuDriverGetVersion:
    a recorded GPU host of tests/gpu_hosts/ (request.param names it), for the GPU-simulation lane's modules."""
    from torchimages.checks import probe_gpu

    from . import gpu_hosts

    scenario = gpu_hosts.load(request.param)
    for name, value in gpu_hosts.stand_in_nvidia_smi(scenario, tmp_path / "bin").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(probe_gpu, "NVIDIA_DRIVER_PROC", gpu_hosts.proc_driver_version(scenario, tmp_path / "proc"))
    monkeypatch.setattr(probe_gpu, "libcuda_driver_version", lambda: scenario["libcuda"]["driver_version"])
    return scenario
