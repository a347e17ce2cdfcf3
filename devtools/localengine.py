"""A private Docker engine and registry on this machine, so images can be built, verified and pushed without one.

    python -m devtools.localengine up     # start (or reuse) dockerd + registry, seed base images, print env lines
    python -m devtools.localengine env    # print the env lines of a running engine
    python -m devtools.localengine down   # stop what `up` started (data and caches stay, so the next `up` is fast)

`up` prints shell lines for `DOCKER_HOST` and `TORCHIMAGES_REGISTRY` on stdout and also writes them to `.engine/env`;
progress goes to stderr. No container registry needs to be reachable: base images are built with debootstrap from the
Debian archive, which is why `up` needs root on a machine that has no engine yet.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from torchimages.build import offline_base
from torchimages.build.offline_base import FOREIGN_NAMESPACES, MIRRORS  # noqa: F401 (devtools/cosign.py takes MIRRORS)
from torchimages.files import atomic_write

REPO = Path(__file__).resolve().parent.parent
STATE = REPO / ".engine"
_REPO_KEY = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
# containerd binds unix sockets deep below dockerd's exec root and a socket path cannot exceed 108 bytes, so the exec
# root and our socket live under a short /run path (keyed by checkout, so two checkouts never share one) rather than
# under the repository.
RUN_DIR = Path("/run") / f"torchimages-{_REPO_KEY}"
SOCKET = RUN_DIR / "docker.sock"
PRIVATE_HOST = f"unix://{SOCKET}"
EXEC_ROOT = RUN_DIR / "exec"
DATA_ROOT = STATE / "docker"
DOCKERD_PIDFILE = STATE / "dockerd.pid"
DOCKERD_LOG = STATE / "dockerd.log"
CACHE = STATE / "cache"
REGISTRY_DIR = STATE / "registry"
REGISTRY_CONFIG = REGISTRY_DIR / "config.yml"
REGISTRY_DATA = REGISTRY_DIR / "data"
REGISTRY_PIDFILE = REGISTRY_DIR / "registry.pid"
REGISTRY_LOG = STATE / "registry.log"
DEBOOTSTRAP_LOG = STATE / "debootstrap.log"
ENV_FILE = STATE / "env"
LOCK_FILE = STATE / "lock"

# Images the engine must hold because nothing can be pulled. Each is "[<namespace>/]<distro>:<suite>" and is built by
# debootstrap from MIRRORS[distro] (torchimages/build/offline_base.py, which `torchimages base` runs too); adding e.g.
# "debian:trixie" needs nothing else. A namespace of FOREIGN_NAMESPACES is Docker Hub's per-architecture repository of
# the same official image (arm64v8/debian: the aarch64 rows' base).
SEEDED_BASES = ("debian:bookworm", "arm64v8/debian:bookworm")
# Images for another machine (aarch64 on an x86_64 host) are built and run under qemu: Debian's qemu-user-static
# registers its handlers with binfmt_misc with fix_binary set, so containers need no qemu inside them.
BINFMT_MISC = Path("/proc/sys/fs/binfmt_misc")
QEMU_BINFMT_CONFS = (Path("/usr/lib/binfmt.d"), Path("/usr/share/binfmts"))
# Debian package -> the program we need from it.
# skopeo: publishing talks to registries through it (torchimages/peers/registry.py).
# pigz: dockerd and containerd decompress gzip layers with unpigz when it is on their PATH (doctor's advice, measured
# in docs/benchmarks-log.md); the engine the tests pull from follows it.
PACKAGES = {"docker.io": "dockerd", "docker-registry": "docker-registry", "debootstrap": "debootstrap",
            "skopeo": "skopeo", "pigz": "unpigz"}
# Only on a host that runs another machine's images under emulation (Debian 12 and 13 both package them so).
EMULATION_PACKAGES = {"qemu-user-static": "qemu-aarch64-static", "binfmt-support": "update-binfmts"}
REGISTRY_BIN = "/usr/bin/docker-registry"
DEFAULT_REGISTRY_PORT = 5000
ENGINE_START_S = 60
REGISTRY_START_S = 30
STOP_GRACE_S = 20
PROBE_TIMEOUT_S = 10
LOG_TAIL_LINES = 20
# dockerd and debootstrap call iptables, mount and friends, which live in sbin dirs that non-login PATHs often miss.
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])

# Daemons are meant to outlive the Popen objects that started them; holding the objects keeps Python from warning
# that a child "is still running" whenever one is garbage collected.
_DETACHED: list[subprocess.Popen] = []


class EngineError(Exception):
    """No engine could be provided; the message says what to do about it."""


@dataclass(frozen=True)
class EngineInfo:
    docker_host: str
    registry: str
    # True when the engine is the private dockerd that `down` stops (whichever `up` started it); False when an engine
    # found at $DOCKER_HOST is reused.
    started_by_us: bool
    dockerd_pid: int | None = None
    registry_pid: int | None = None

    def env_lines(self) -> list[str]:
        return [f"export DOCKER_HOST={shlex.quote(self.docker_host)}",
                f"export TORCHIMAGES_REGISTRY={shlex.quote(self.registry)}"]


# ---------------------------------------------------------------------------------------------------------- public API

def ensure_engine(foreign: bool = True) -> EngineInfo:
    """What `up` does: an answering engine holding SEEDED_BASES, a registry, and `.engine/env` describing both.
    Without foreign (`up --native-only`, the main job when it builds no other machine's row): no emulation and no
    other machine's base, which on a fresh x86_64 host are qemu's install and a debootstrap under it."""
    with _locked():
        client, docker_host, ours = _ensure_dockerd()
        try:
            if foreign:
                _ensure_emulation()
            _seed_bases(client, docker_host, [name for name in SEEDED_BASES if foreign or _is_native(name)])
        finally:
            client.close()
        registry, registry_pid = _ensure_registry()
        info = EngineInfo(docker_host, registry, ours, _dockerd_pid() if ours else None, registry_pid)
        _write_env(info)
        return info


def stop_engine() -> list[str]:
    """What `down` does; returns a line for each daemon it stopped. Data root and caches are kept."""
    if not STATE.is_dir():
        return []
    stopped = []
    with _locked():
        for name, pidfile, pid in (("registry", REGISTRY_PIDFILE, _registry_pid()),
                                   ("dockerd", DOCKERD_PIDFILE, _dockerd_pid())):
            if pid is not None:
                _log(f"stopping {name} (pid {pid})")
                _stop(pid)
                stopped.append(f"stopped {name} (pid {pid})")
            pidfile.unlink(missing_ok=True)
        ENV_FILE.unlink(missing_ok=True)
    return stopped


def read_env() -> EngineInfo | None:
    """The engine `.engine/env` describes, if it still answers (engine and registry both); None otherwise."""
    try:
        values = _parse_env(ENV_FILE.read_text())
    except FileNotFoundError:
        return None
    docker_host, registry = values.get("DOCKER_HOST"), values.get("TORCHIMAGES_REGISTRY")
    if not docker_host or not registry or not _registry_answers(registry):
        return None
    ours = docker_host == PRIVATE_HOST
    client = _answering(docker_host, honour_tls_env=not ours)
    if client is None:
        return None
    client.close()
    return EngineInfo(docker_host, registry, ours, _dockerd_pid() if ours else None, _registry_pid())


# -------------------------------------------------------------------------------------------------------------- dockerd

def _ensure_dockerd() -> tuple[docker.DockerClient, str, bool]:
    """A client for the engine to use, its DOCKER_HOST, and whether it is our private one."""
    given = os.environ.get("DOCKER_HOST")
    if given and given != PRIVATE_HOST:
        client = _answering(given, honour_tls_env=True)
        if client is not None:
            _log(f"using the engine at $DOCKER_HOST={given}")
            return client, given, False
        _log(f"nothing answers at $DOCKER_HOST={given}; using the private engine at {SOCKET}")
    client = _answering(PRIVATE_HOST)
    if client is not None:
        _log(f"reusing the private engine at {SOCKET} (pid {_dockerd_pid()})")
        return client, PRIVATE_HOST, True
    _require_root(f"no Docker engine answers at {given or '$DOCKER_HOST (unset)'} or {SOCKET}, and starting one")
    _ensure_tools(PACKAGES)
    return _start_dockerd(), PRIVATE_HOST, True


def _start_dockerd() -> docker.DockerClient:
    hung = _dockerd_pid()
    if hung is not None:
        # Ours, alive, yet not answering (the lock rules out a concurrent `up` starting it): start over.
        _log(f"dockerd pid {hung} does not answer; restarting it")
        _stop(hung)
    # dockerd refuses to start while its pidfile names a live process, and after a reboot that may be anyone.
    DOCKERD_PIDFILE.unlink(missing_ok=True)
    for directory in (DATA_ROOT, EXEC_ROOT):
        directory.mkdir(parents=True, exist_ok=True)
    namespace = f"torchimages-{_REPO_KEY}"
    command = [_program("dockerd"), "--host", PRIVATE_HOST, "--data-root", str(DATA_ROOT),
               "--exec-root", str(EXEC_ROOT), "--pidfile", str(DOCKERD_PIDFILE),
               # Where a system containerd runs, dockerd uses it; own namespaces keep us apart from the system dockerd.
               "--containerd-namespace", namespace, "--containerd-plugins-namespace", f"{namespace}-plugins"]
    _log(f"starting dockerd (data root {DATA_ROOT}, log {DOCKERD_LOG})")
    process = _spawn(command, DOCKERD_LOG)
    deadline = time.monotonic() + ENGINE_START_S
    while time.monotonic() < deadline and process.poll() is None:
        client = _answering(PRIVATE_HOST)
        if client is not None:
            _log(f"dockerd is up (pid {process.pid})")
            return client
        time.sleep(0.5)
    state = f"exited with status {process.returncode}" if process.poll() is not None else \
        f"did not answer within {ENGINE_START_S} s"
    _stop(process.pid)
    raise EngineError(f"dockerd {state}; last lines of {DOCKERD_LOG}:\n{_tail(DOCKERD_LOG)}")


def _answering(base_url: str, *, honour_tls_env: bool = False) -> docker.DockerClient | None:
    """A client for base_url when an engine answers there; TLS settings come from the environment only if asked."""
    environment = dict(os.environ) if honour_tls_env else {}
    environment["DOCKER_HOST"] = base_url
    try:
        client = docker.from_env(environment=environment, timeout=PROBE_TIMEOUT_S)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError):
        return None
    return client


def _dockerd_pid() -> int | None:
    return _our_pid(DOCKERD_PIDFILE, "dockerd", str(DATA_ROOT))


# -------------------------------------------------------------------------------------------------------- base images

def _is_native(name: str) -> bool:
    """Whether a seeded base is for this host's machine (a foreign namespace names its machine)."""
    namespace = FOREIGN_NAMESPACES.get(_namespace(name))
    return namespace is None or namespace[2] == os.uname().machine


def _seed_bases(client: docker.DockerClient, docker_host: str, names: list[str]) -> None:
    for name in names:
        if _has_image(client, name):
            continue
        tarball = _rootfs_tarball(name)
        base = offline_base.parse_base(name)
        _log(f"importing {name} from {tarball}")
        if base.foreign:
            _ensure_tools(["skopeo"])
        CACHE.mkdir(parents=True, exist_ok=True)
        offline_base.import_base(client.api, tarball, base, docker_host, _run_debootstrap_logged, CACHE)
        if not _has_image(client, name):
            raise EngineError(f"importing {tarball} did not create {name}")


def _namespace(name: str) -> str:
    return name.split("/")[0] if "/" in name else ""


def _ensure_emulation() -> None:
    """On an x86_64 host, qemu registered with binfmt_misc for every foreign base's machine, saying what it did."""
    if os.uname().machine != "x86_64":
        return
    for _, _, machine in FOREIGN_NAMESPACES.values():
        handler = BINFMT_MISC / f"qemu-{machine}"
        if handler.is_file():
            continue
        _require_root(f"running {machine} images under emulation needs qemu registered with binfmt_misc, and that")
        _ensure_tools(EMULATION_PACKAGES)
        if not (BINFMT_MISC / "register").exists():
            _run_logged(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_MISC)], DEBOOTSTRAP_LOG)
        _register_qemu(machine)
        if not handler.is_file():
            raise EngineError(f"qemu-{machine} is still not registered in {BINFMT_MISC}; see {DEBOOTSTRAP_LOG}")
        _log(f"registered qemu-{machine} (qemu-user-static) with binfmt_misc (fix_binary): {machine} images build "
             f"and run on this x86_64 host under emulation, slowly")


def _register_qemu(machine: str) -> None:
    """Debian 13 ships systemd-binfmt lines (/usr/lib/binfmt.d/qemu-*.conf), Debian 12 binfmt-support's formats."""
    conf = QEMU_BINFMT_CONFS[0] / f"qemu-{machine}.conf"
    if conf.is_file():
        line = next(text for text in conf.read_text().splitlines() if text.startswith(":"))
        (BINFMT_MISC / "register").write_text(line)
    else:
        _run_logged([_program("update-binfmts"), "--enable", f"qemu-{machine}"], DEBOOTSTRAP_LOG)


def _has_image(client: docker.DockerClient, name: str) -> bool:
    try:
        client.images.get(name)
    except docker.errors.ImageNotFound:
        return False
    return True


def _rootfs_tarball(name: str) -> Path:
    """The cached root filesystem for name, debootstrapped on first use so that a lost data root re-seeds quickly:
    the updates and security suites in its apt sources, no cached .debs (offline_base.py says why)."""
    base = offline_base.parse_base(name)
    tarball = CACHE / f"{base.file_stem}.tar"
    if tarball.is_file():
        return tarball
    _require_root(f"{name} is not in the engine and building it with debootstrap")
    _ensure_tools(["debootstrap"])
    CACHE.mkdir(parents=True, exist_ok=True)
    # Another machine's packages configure under qemu (_ensure_emulation): many minutes instead of a few.
    _log(f"debootstrapping {name} from {base.mirror} (a few minutes; log {DEBOOTSTRAP_LOG})")
    return offline_base.make_tarball(base, tarball, _run_debootstrap_logged)


def _run_debootstrap_logged(command: list[str]) -> None:
    _run_logged(command, DEBOOTSTRAP_LOG)


# ------------------------------------------------------------------------------------------------------------ registry

def _ensure_registry() -> tuple[str, int]:
    """Our registry's host:port and pid, reusing the recorded one when it still answers."""
    port, pid = _recorded_registry_port(), _registry_pid()
    if pid is not None and port is not None and _registry_answers(f"127.0.0.1:{port}"):
        _log(f"reusing the registry at 127.0.0.1:{port} (pid {pid})")
        return f"127.0.0.1:{port}", pid
    if pid is not None:
        _log(f"registry pid {pid} does not answer; restarting it")
        _stop(pid)
    _ensure_tools(["docker-registry", "skopeo"])
    port = _free_port(port)
    _write_registry_config(port)
    _log(f"starting the registry on 127.0.0.1:{port} (storage {REGISTRY_DATA}, log {REGISTRY_LOG})")
    process = _spawn([REGISTRY_BIN, "serve", str(REGISTRY_CONFIG)], REGISTRY_LOG)
    REGISTRY_PIDFILE.write_text(f"{process.pid}\n")
    deadline = time.monotonic() + REGISTRY_START_S
    while time.monotonic() < deadline and process.poll() is None:
        if _registry_answers(f"127.0.0.1:{port}"):
            return f"127.0.0.1:{port}", process.pid
        time.sleep(0.25)
    _stop(process.pid)
    REGISTRY_PIDFILE.unlink(missing_ok=True)
    raise EngineError(f"the registry did not answer on 127.0.0.1:{port}; last lines of {REGISTRY_LOG}:\n"
                      f"{_tail(REGISTRY_LOG)}")


def _write_registry_config(port: int) -> None:
    REGISTRY_DATA.mkdir(parents=True, exist_ok=True)
    # Strings are written as JSON, which YAML reads, so any path survives quoting.
    config = f"""\
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: {json.dumps(str(REGISTRY_DATA))}
  delete:
    enabled: true  # pruning tags needs manifest deletes
  cache:
    blobdescriptor: inmemory
http:
  addr: {json.dumps(f"127.0.0.1:{port}")}
"""
    atomic_write(REGISTRY_CONFIG, config)


def _recorded_registry_port() -> int | None:
    try:
        match = re.search(r'addr: "127\.0\.0\.1:(\d+)"', REGISTRY_CONFIG.read_text())
    except FileNotFoundError:
        return None
    return int(match.group(1)) if match else None


def _free_port(recorded: int | None) -> int:
    """The recorded port (so pushed tags keep their address), else 5000, else whatever the kernel hands out."""
    for port in (recorded, DEFAULT_REGISTRY_PORT):
        if port is not None and _port_is_free(port):
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        # Like the registry itself, ignore connections of a just-stopped registry lingering in TIME_WAIT.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _registry_answers(address: str) -> bool:
    try:
        # A stopped registry refuses at once; a busy one (the engine tests push from two processes) may be slow.
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=10) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _registry_pid() -> int | None:
    return _our_pid(REGISTRY_PIDFILE, "docker-registry", str(REGISTRY_CONFIG))


# ----------------------------------------------------------------------------------------------- processes and tools

def _spawn(command: list[str], log: Path) -> subprocess.Popen:
    """Start a daemon that survives us and our terminal's Ctrl-C, writing to log (the previous run's kept as .1)."""
    if log.exists():
        log.replace(log.with_name(log.name + ".1"))
    with open(log, "wb") as output:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True, env={**os.environ, "PATH": SBIN_PATH})
    _DETACHED.append(process)
    return process


def _our_pid(pidfile: Path, program: str, marker: str) -> int | None:
    """The pid recorded in pidfile if that process is still the one we started (pids get reused)."""
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _is_ours(pid, program, marker) else None


def _is_ours(pid: int, program: str, marker: str) -> bool:
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    # A zombie's cmdline is empty, so it counts as gone.
    return Path(arguments[0]).name == program and marker in arguments


def _stop(pid: int) -> None:
    """SIGTERM, up to STOP_GRACE_S for a clean exit (dockerd stops its containers), then SIGKILL."""
    try:
        identity = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if not identity:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and _same_process(pid, identity):
        time.sleep(0.2)
    if _same_process(pid, identity):
        _log(f"pid {pid} ignored SIGTERM for {STOP_GRACE_S} s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _reap(pid)


def _same_process(pid: int, identity: bytes) -> bool:
    _reap(pid)
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() == identity
    except OSError:
        return False


def _reap(pid: int) -> None:
    # Daemons started by this very process turn into zombies when they exit, until waited for.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _program(name: str) -> str:
    path = shutil.which(name, path=SBIN_PATH)
    if path is None:
        raise EngineError(f"{name} is not installed")
    return path


def _ensure_tools(needed: Iterable[str]) -> None:
    """apt-get install the packages in needed whose programs are missing (root only; otherwise say what to run)."""
    programs = {**PACKAGES, **EMULATION_PACKAGES}
    missing = [package for package in needed if shutil.which(programs[package], path=SBIN_PATH) is None]
    if not missing:
        return
    _require_root(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed, and installing")
    _log(f"installing {' '.join(missing)} with apt-get")
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "PATH": SBIN_PATH}
    apt_log = STATE / "apt.log"
    if _run_logged(install, apt_log, environment, check=False) != 0:
        # Only a stale or missing package index makes the first try fail on a healthy machine.
        _run_logged(["apt-get", "update"], apt_log, environment)
        _run_logged(install, apt_log, environment)


def _run_logged(command: list[str], log: Path, environment: dict[str, str] | None = None, *,
                check: bool = True) -> int:
    with open(log, "ab") as output:
        output.write(f"$ {shlex.join(command)}\n".encode())
        output.flush()
        returncode = subprocess.run(command, check=False, stdin=subprocess.DEVNULL, stdout=output,
                                    stderr=subprocess.STDOUT,
                                    env=environment or {**os.environ, "PATH": SBIN_PATH}).returncode
    if check and returncode != 0:
        raise EngineError(f"`{shlex.join(command)}` failed with status {returncode}; last lines of {log}:\n"
                          f"{_tail(log)}")
    return returncode


def _require_root(what: str) -> None:
    if os.geteuid() == 0:
        return
    raise EngineError(f"{what} needs root. Run `sudo {sys.executable} -m devtools.localengine up` (or "
                      "`sudo make engine`), or point DOCKER_HOST at an engine you may use, e.g. "
                      "`export DOCKER_HOST=unix:///var/run/docker.sock` as a member of the docker group.")


# ------------------------------------------------------------------------------------------------------------- files

@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise `up` and `down` (parallel test workers all call ensure_engine)."""
    try:
        STATE.mkdir(parents=True, exist_ok=True)
        LOCK_FILE.touch()
    except PermissionError as error:
        # Typically `up` ran as root before and this is a plain user: their engine is not ours to manage.
        raise EngineError(f"cannot write {STATE} ({error.strerror}); run as its owner (or root), or remove it") \
            from None
    with open(LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log("waiting for another `up` or `down` to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write_env(info: EngineInfo) -> None:
    atomic_write(ENV_FILE, "".join(f"{line}\n" for line in info.env_lines()))


def _parse_env(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            values[key] = value
    return values


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} does not exist)"


def _log(message: str) -> None:
    print(f"localengine: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.localengine",
                                     description="A private Docker engine and registry for building and testing.")
    parser.add_argument("command", choices=("up", "down", "env"),
                        help="up: start or reuse and print env lines; down: stop; env: print env lines if up")
    parser.add_argument("--native-only", action="store_true",
                        help="with up: no emulation and no base for another machine (the main job without -arm64 rows)")
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "up":
            return _cmd_up(foreign=not arguments.native_only)
        return {"down": _cmd_down, "env": _cmd_env}[arguments.command]()
    except EngineError as error:
        _log(str(error))
        return 1


def _cmd_up(foreign: bool) -> int:
    started = time.monotonic()
    info = ensure_engine(foreign)
    _log(f"ready in {time.monotonic() - started:.1f} s; load it with `source {ENV_FILE}`")
    print("\n".join(info.env_lines()))
    return 0


def _cmd_down() -> int:
    stopped = stop_engine()
    print("\n".join(stopped) if stopped else "nothing was running")
    return 0


def _cmd_env() -> int:
    info = read_env()
    if info is None:
        _log("no engine is up; start one with `python -m devtools.localengine up` (or `make engine`)")
        return 1
    print("\n".join(info.env_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
