"""Stage 3: build images/<tag>/ on a Docker engine: parallel, skip-unchanged, logged, isolated failures."""
from __future__ import annotations

import os
import re
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import docker
import docker.errors
import docker.utils
import requests
import urllib3

from ..build_inputs.container import BuildInputsContainer
from ..build_inputs.server import BUILD_INPUTS_HOST, BuildInputsServer, authorized_url, new_token, token_arg
from ..files import check_destinations, open_new, read_text
from ..invocation import command, offline_base
from ..model import LABEL_PREFIX, PYPI, ImageSpec, InputError, TorchImagesError
from ..peers import engine
from ..redaction import Secrets
from ..reporting import RowReport
from . import buildkit
from . import debs as deb_pins
from .bases_lock import LOCK_NAME, read_lock
from .context import BuildContext, BuildOptions, base_identity, build_context, context_tar, input_hash
from .failure import diagnose, failure_line, strip_ansi
from .render import PINNED_DEBS_ENTRY
from .reproducible import base_entries, settle_image, source_date

# read_wheel_record and wheel_record_path: publish and rebuild take them from here.
from .wheel_record import read_wheel_record, wheel_record_path, write_wheel_record  # noqa: F401

INPUT_HASH_LABEL = f"{LABEL_PREFIX}.input-hash"
REVISION_LABEL = "org.opencontainers.image.revision"  # the row folder's commit (reproducible.source_date)
# A build step that prints nothing for this long is stuck (pip, apt and the compilers print as they go): the build is
# failed, naming the engine, instead of waiting forever on a wedged dockerd.
BUILD_SILENCE_S = 3600
STEP = re.compile(r"^Step ([0-9]+)/([0-9]+) : ", re.ASCII)
BASE_ARG = re.compile(r"^ARG BASE_IMAGE=(\S+)$", re.MULTILINE | re.ASCII)
RUNNING_IN = re.compile(r"---> Running in ([0-9a-f]{12,64})")
STEP_IMAGE = re.compile(r"^ ---> ([0-9a-f]{12,64})$", re.MULTILINE)
SECURITY_REFRESH_ARG = "OS_SECURITY_REFRESH"  # the build arg the OS security layer's cache depends on
# Where the build-input server runs: this host's loopback (the engine shares its network), or a container on the engine.
INPUTS_SERVERS = ("loopback", "container")
# Which of the engine's builders builds: its classic one (what the Docker SDK's build() drives), or its BuildKit (the
# same Dockerfile; each step's snapshot is its layer, where the classic builder writes a step's files again when it
# commits them: the venv layers in half the time, and no second copy of them on disk at the build's peak).
BUILDERS = ("classic", "buildkit")


@dataclass
class BuildResult:
    tag: str
    status: str  # built | skipped | failed | cancelled
    image: str = ""
    image_id: str = ""
    size: int = 0
    duration: float = 0.0
    input_hash: str = ""
    error: str = ""
    log: str = ""


def status_words(result: BuildResult) -> str:
    """A result's status as the console shows it: a build left out because nothing changed is "up to date" with its
    image id ("skipped" means a check not run elsewhere)."""
    if result.status == "skipped":
        return f"up to date (sha256:{result.image_id.removeprefix('sha256:')[:12]})"
    return result.status


def local_name(spec: ImageSpec) -> str:
    return f"{spec.repository}:{spec.tag}"


def cache_name(spec: ImageSpec) -> str:
    """Where `nightly` puts a row's last published image on an engine that has none of the row's layers (a fresh
    runner): the build takes layers from it."""
    return f"{local_name(spec)}.published"


def build_args(options: BuildOptions, context: BuildContext, tag: str, token: str) -> dict[str, str]:
    """The layers' wheel identities, the OS security refresh the nightly asked for, and the proxies: Docker keeps its
    predefined proxy args out of the image history and the cache key. The build-input server is on loopback: never
    through a proxy; no_proxy also carries the build's token for it (server.py), on every build and every stage."""
    args = dict(context.layer_args)
    if tag in options.security_refresh:
        args[SECURITY_REFRESH_ARG] = options.security_refresh[tag]
    args.update(options.proxies)
    pinned = PINNED_DEBS_ENTRY if tag in options.pinned_debs else ""
    for name in ("NO_PROXY", "no_proxy"):  # the token last: the apt steps read it there (templates/os/apt.j2)
        args[name] = ",".join(filter(None, [BUILD_INPUTS_HOST, options.proxies.get(name, ""), pinned,
                                            token_arg(token)]))
    return args


def pip_settings(spec: ImageSpec, options: BuildOptions, served_wheels: bool, token: str) -> str:
    """pip's configuration for the build steps, served to them (never a build arg: arguments of the final stage's
    steps are written into its history). {ca_bundle} is where the install script puts the CA bundle."""
    index, extra = options.pip_index_url or spec.index_url, options.extra_index_url or PYPI
    lines = ["[global]", f"index-url = {index}"]
    if extra.rstrip("/") != index.rstrip("/"):  # a row on PyPI itself: pip would say "Looking in indexes" twice
        lines.append(f"extra-index-url = {extra}")
    if options.ca_bundle:
        lines.append("cert = {ca_bundle}")
    if served_wheels or options.wheelhouse is not None:
        # --wheelhouse promises no index: pip is given none even where the row's folder is missing (refused before
        # the build, wheels.check_wheelhouse), so that a gap fails the build instead of reaching the network.
        # Plain HTTP on loopback, to a server this build started: pip needs to be told it may trust it.
        lines += ["no-index = true", f"find-links = {authorized_url(token)}/wheels/", f"trusted-host = {BUILD_INPUTS_HOST}"]
    return "\n".join(lines) + "\n"


def engine_is_local() -> bool:
    """Whether the engine shares this host's network: a socket, or TCP to a loopback address."""
    host = os.environ.get("DOCKER_HOST", "")
    return not host or host.startswith(("unix://", "npipe://")) or urlsplit(host).hostname in ("localhost", "127.0.0.1", "::1")


def default_inputs_server() -> str:
    """The build-input server on this host's loopback for an engine on this host; on the engine for another one."""
    return "loopback" if engine_is_local() else "container"


def interpreter(spec: ImageSpec) -> str:
    """The row's Python in its `python` stage, as the rendered venv step names it (templates/macros.j2)."""
    return f"python{spec.python}" if spec.python_from_os else f"/opt/python/python{spec.python}"


def base_reference(spec: ImageSpec, images_dir: Path) -> str:
    """The base the rendered Dockerfile builds on: a lock-pinned image@digest, or the matrix's tag."""
    dockerfile = images_dir / spec.tag / "Dockerfile"
    match = BASE_ARG.search(read_text(dockerfile, f"run {command('render')}"))  # bounded: a FIFO would hang
    return match.group(1) if match else spec.base_image


def runtime_labels(context: BuildContext) -> dict[str, str]:
    """Creation date and revision: the row's commit, never the clock or the toolkit's HEAD (reproducible.py)."""
    return {
        INPUT_HASH_LABEL: context.input_hash,
        "org.opencontainers.image.created": context.source.timestamp,
        REVISION_LABEL: context.source.commit,
        "org.opencontainers.image.base.digest": context.base_image_id,
    }


class Progress:
    """Receives build events; the CLI shows them (rich live view on a terminal, plain lines in CI)."""

    def started(self, tag: str) -> None: ...
    def step(self, tag: str, step: int, total: int) -> None: ...
    def finished(self, result: BuildResult) -> None: ...


class Builder:
    def __init__(self, docker_client: docker.DockerClient, options: BuildOptions, progress: Progress | None = None):
        self.client = docker_client
        self.options = options
        self.progress = progress or Progress()
        # The engine's errors repeat the build request's URL, build args and all: what goes to the log, the report
        # and the console passes through this first.
        self.secrets = Secrets.in_urls(options.pip_index_url, options.extra_index_url, *options.proxies.values())
        self.cancelled = threading.Event()
        self._intermediate: set[str] = set()
        self._step_images: list[str] = []
        self._buildkit_builds: set[str] = set()  # the ids of the BuildKit builds running, to cancel them by
        self._lock = threading.Lock()
        # For the line an interrupted run ends with: the rows it set out to build, the image each had before, and
        # the status of each build that ended.
        self._todo: list[ImageSpec] = []
        self._previous: dict[str, str] = {}
        self._ended: dict[str, str] = {}

    def input_hash(self, spec: ImageSpec) -> str | None:
        """The input hash of spec as it would be built now, also on an engine without its base (nothing pulled);
        None when nothing identifies the base. An InputError for a missing Dockerfile or a damaged lock."""
        inputs = self.current_inputs(spec)
        return input_hash(inputs) if inputs is not None else None

    def current_inputs(self, spec: ImageSpec) -> dict[str, str] | None:
        """Each input of spec as it would be built now (build_inputs); None when nothing identifies the base."""
        base = base_reference(spec, self.options.images_dir)
        identity = base_identity(base, self._image_id(base), self._locked_image_id(spec))
        return build_context(spec, self.options, identity, "").inputs if identity else None

    def engine_input_hash(self, spec: ImageSpec) -> str | None:
        """The input hash the engine's image of spec was built with; None when the engine has no image of it."""
        image = engine.inspect_image(self.client, local_name(spec))
        return (image["Config"].get("Labels") or {}).get(INPUT_HASH_LABEL, "") if image else None

    def plan(self, spec: ImageSpec) -> tuple[BuildContext | None, BuildResult | None]:
        """Decide quickly whether an image must be built; returns (context, None) or (None, skipped/failed result)."""
        try:
            base = base_reference(spec, self.options.images_dir)
            base_id = self._image_id(base)
            if base_id is None and not self.options.pull:
                return None, BuildResult(spec.tag, "failed", error=f"base image {base} is not on the engine: "
                                         f"`docker pull` it, build with --pull, or {offline_base()}")
            identity = base_identity(base, base_id, self._locked_image_id(spec)) or base
            context = build_context(spec, self.options, identity, base_id or "")
        except InputError as error:
            return None, BuildResult(spec.tag, "failed", error=str(error))
        if not (self.options.force or self.options.no_cache or spec.tag in self.options.security_refresh):
            existing = engine.inspect_image(self.client, local_name(spec))
            labels = (existing["Config"].get("Labels") or {}) if existing else {}
            # Same inputs, but an image labelled with another revision (built from uncommitted files, then committed)
            # is built again: what it says of its source, and so its id, would not be a build of this tree's.
            if existing and labels.get(INPUT_HASH_LABEL) == context.input_hash and labels.get(REVISION_LABEL) == \
                    source_date(self.options.images_dir / spec.tag).commit:
                return None, BuildResult(spec.tag, "skipped", local_name(spec), existing["Id"], existing["Size"],
                                         input_hash=context.input_hash, log=str(self._log_path(spec)))
        if self.options.inputs_server == "loopback" and not engine_is_local():
            return None, BuildResult(spec.tag, "failed", error=f"DOCKER_HOST {os.environ['DOCKER_HOST']} is another "
                                     "host: it cannot reach the build-input server on this host's loopback; build "
                                     "with `--inputs-server container` (the server runs on the engine)")
        return context, None

    def build_all(self, specs: list[ImageSpec]) -> list[BuildResult]:
        results: dict[str, BuildResult] = {}
        todo: list[tuple[ImageSpec, BuildContext]] = []
        for spec in specs:
            context, decided = self.plan(spec)
            if decided:
                results[spec.tag] = decided
                self.progress.finished(decided)
            elif context:
                todo.append((spec, context))
        check_destinations([path for spec, _ in todo for path in self._log_paths(spec)], self.options.reports_dir)
        self._todo = [spec for spec, _ in todo]
        for spec in self._todo:
            previous = engine.inspect_image(self.client, local_name(spec))
            if previous:
                self._previous[spec.tag] = previous["Id"]
        pool = ThreadPoolExecutor(max_workers=max(1, self.options.jobs))
        try:
            futures = {}
            first_of_row: dict[int, Future] = {}
            # Flavors of one matrix row share their first layers: a later flavor waits for the first one and
            # takes those layers from the build cache instead of installing gigabytes of wheels a second time.
            # The first is always submitted earlier, so waiting never takes the last free worker from it.
            for spec, context in todo:
                donor = first_of_row.get(spec.matrix_line)
                future = pool.submit(self._build_one, spec, context, donor)
                first_of_row.setdefault(spec.matrix_line, future)
                futures[future] = spec
            for future in as_completed(futures):
                result = future.result()
                results[result.tag] = result
                self.progress.finished(result)
                if result.status == "failed" and self.options.fail_fast:
                    self.cancel()
        except KeyboardInterrupt:
            self.cancel()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            self._remove_intermediate_containers()
            if self.options.prune_build_stages:
                self._prune_build_stages()
        for spec, _ in todo:
            results.setdefault(spec.tag, BuildResult(spec.tag, "cancelled", error="not started: build cancelled"))
        return [results[spec.tag] for spec in specs if spec.tag in results]

    def interrupted_line(self) -> str:
        """After Ctrl-C: what each row this run was building has now ("" when every build had ended)."""
        parts = []
        for spec in self._todo:
            if self._ended.get(spec.tag) == "built":
                continue
            previous = self._previous.get(spec.tag)
            log = f"this build's log: {self._interrupted_log_path(spec)}" if spec.tag in self._ended else "not started"
            parts.append(f"{spec.tag}: the previous image sha256:{previous.removeprefix('sha256:')[:12]} was kept, "
                         f"and its build.log ({log})" if previous else f"{spec.tag}: no image, none before ({log})")
        return f"build interrupted: {'; '.join(parts)}" if parts else ""

    def cancel(self) -> None:
        """Stop every running build by removing the container of its current step; the engine then
        fails that build, and any step that starts afterwards is removed as soon as it appears."""
        self.cancelled.set()
        with self._lock:
            running, builds = list(self._intermediate), list(self._buildkit_builds)
        for container_id in running:
            self._remove_container(container_id)
        for build_id in builds:
            engine.cancel_build(self.client, build_id)

    def _build_one(self, spec: ImageSpec, context: BuildContext, donor: Future | None = None) -> BuildResult:
        context = replace(context, source=source_date(self.options.images_dir / spec.tag))
        if donor is not None:
            wait([donor])
        fresh = self._fresh_layers(donor)
        if self.cancelled.is_set():
            return BuildResult(spec.tag, "cancelled", error="not started: build cancelled")
        log_path = self._log_path(spec)
        # Written beside build.log and moved into place when the build ends: an interrupted build leaves the last
        # finished build's log as build.log, and its own as build.interrupted.log.
        running_log = self._running_log_path(spec)
        started = time.monotonic()
        self.progress.started(spec.tag)
        result = BuildResult(spec.tag, "failed", local_name(spec), input_hash=context.input_hash, log=str(log_path))
        # One connection per build thread: a requests session is not meant to be shared across threads.
        api = docker.APIClient(timeout=BUILD_SILENCE_S, version=self.client.api.api_version,
                               **docker.utils.kwargs_from_env())
        token = new_token()  # this build's own: its server answers no one else
        try:
            pins = self.options.pinned_debs.get(spec.tag)
            with open_new(running_log, self.options.reports_dir) as log, context_tar(context) as tar, \
                    self._served_debs(pins) as debs, \
                    self._inputs_server(api, spec, context, tar, log, fresh, token, debs) as served:
                python_stage = served.image if isinstance(served, BuildInputsContainer) else None
                image_id = self._stream_build(api, spec, context, tar, log, token, *served.build_network,
                                              fresh=fresh or self._fresh_layers_of(python_stage))
            base = context.base_image_id or base_reference(spec, self.options.images_dir)
            image_id = settle_image(api, image_id, local_name(spec), context.source.timestamp, base_entries(api, base),
                                    classic_base=base if self.options.builder == "classic" else None)
            inspected = engine.inspect_image(self.client, image_id)  # bounded, and of an image's shape
            if inspected is None:
                raise BuildFailed(f"the engine built image {image_id} and then had no such image")
            built_debs = deb_pins.image_pins(api, image_id)
            if pins is not None:
                deb_pins.check_built(spec.tag, built_debs, pins)
            result.status, result.image_id, result.size = "built", inspected["Id"], inspected["Size"]
            write_wheel_record(self.options.reports_dir, spec.tag, context)
            deb_pins.write_report(self.options.reports_dir, spec.tag, built_debs)
        except Exception as error:  # noqa: BLE001 - one image fails, the others go on
            result.error = self.secrets.redact(_build_error(error))
            if self.cancelled.is_set():
                result.status, result.error = "cancelled", "build cancelled"
        finally:
            api.close()
        if result.status == "cancelled":
            result.log = str(self._interrupted_log_path(spec))
        _put_log_in_place(running_log, Path(result.log))
        self._ended[spec.tag] = result.status
        result.duration = round(time.monotonic() - started, 2)
        if result.status == "failed":
            result.error = _failure(result.error, log_path, spec.tag)
        return result

    def _served_debs(self, pins: list[deb_pins.PinnedDeb] | None) -> AbstractContextManager[dict[str, Path]]:
        return deb_pins.served(self.options.debs_dir, pins) if pins is not None and self.options.debs_dir \
            else nullcontext({})

    def _inputs_server(self, api: docker.APIClient, spec: ImageSpec, context: BuildContext, tar, log,
                       fresh: str | None, token: str, debs: dict[str, Path]) -> BuildInputsServer | BuildInputsContainer:
        """The build-input server for this build, not started yet. On the engine, it runs in the image of the row's
        `python` stage, built here first (the image's own build then takes those layers from the cache); pinned
        .debs are served from this host's loopback only (that stage installs them)."""
        pip_conf = pip_settings(spec, self.options, bool(context.wheels), token)
        if self.options.inputs_server == "loopback":
            return BuildInputsServer(context.wheels, pip_conf, context.ca_bundle, token, debs=debs)
        python_stage = self._stream_build(api, spec, context, tar, log, token, "default", {}, target="python",
                                          fresh=fresh)
        tar.seek(0)
        return BuildInputsContainer(api, python_stage, interpreter(spec), context.wheels, pip_conf, context.ca_bundle,
                                    token, host_network=self.options.builder == "buildkit",
                                    serves=str(self._running_log_path(spec).resolve()))

    def _stream_build(self, api: docker.APIClient, spec: ImageSpec, context: BuildContext, tar, log, token: str,
                      network_mode: str, extra_hosts: dict[str, str], target: str | None = None,
                      fresh: str | None = None) -> str:
        """The image built (only up to the stage target names, when given): its steps reach the build-input server
        on network_mode (the host's, or the server's own network on the engine), extra_hosts naming it there. fresh:
        an image this run made without the cache, whose layers this build takes (_fresh_layers)."""
        if self.options.builder == "buildkit":
            return self._buildkit_build(api, spec, context, tar, log, token, network_mode, extra_hosts, target)
        stream = api.build(
            fileobj=tar, custom_context=True, tag=None if target else local_name(spec), target=target,
            buildargs=build_args(self.options, context, spec.tag, token),
            network_mode=network_mode, extra_hosts=extra_hosts or None,
            labels=None if target else runtime_labels(context),
            cache_from=[fresh] if fresh else self._cache_sources(spec),
            nocache=self.options.no_cache and not fresh, pull=self.options.pull, rm=True, forcerm=True, decode=True,
            timeout=BUILD_SILENCE_S,  # docker-py's build ignores the client's timeout: without it, no bound at all
        )
        image_id = ""
        for event in stream:
            if "stream" in event:
                text = self.secrets.redact(strip_ansi(str(event["stream"])))
                log.write(text)
                log.flush()
                self._observe(spec.tag, text)
            if "aux" in event and "ID" in event["aux"]:
                image_id = event["aux"]["ID"]
            self._fail_on_engine_error(event, log)
        return _built(image_id)

    def _buildkit_build(self, api: docker.APIClient, spec: ImageSpec, context: BuildContext, tar, log, token: str,
                        network_mode: str, extra_hosts: dict[str, str], target: str | None) -> str:
        """_stream_build by the engine's BuildKit; its log is BuildKit's plain progress. The image carries its
        inline cache, so that a fresh runner's build takes layers from it as from the classic builder's images."""
        build_id = f"torchimages-{uuid.uuid4().hex}"
        params = buildkit.build_params(
            tag=None if target else local_name(spec), target=target,
            build_args={**build_args(self.options, context, spec.tag, token), "BUILDKIT_INLINE_CACHE": "1"},
            labels=None if target else runtime_labels(context),
            network_mode=network_mode, extra_hosts=extra_hosts, cache_from=self._cache_sources(spec),
            no_cache=self.options.no_cache, pull=self.options.pull, build_id=build_id)
        with self._lock:
            self._buildkit_builds.add(build_id)
        try:
            if self.cancelled.is_set():
                raise BuildFailed("build cancelled")
            events = engine.buildkit_build(api, tar, params, BUILD_SILENCE_S)
            return self._read_buildkit_events(spec.tag, events, log, build_id)
        finally:
            with self._lock:
                self._buildkit_builds.discard(build_id)

    def _read_buildkit_events(self, tag: str, events, log, build_id: str = "") -> str:
        plain, image_id, cancel_sent_again = buildkit.PlainLog(), "", False
        for event in events:
            if build_id and self.cancelled.is_set() and not cancel_sent_again:
                # A cancel that reached the engine before it knew the build is lost: sent once more now that it does.
                engine.cancel_build(self.client, build_id)
                cancel_sent_again = True
            if event.get("id") == buildkit.TRACE_ID:
                self._write_trace(tag, plain, event.get("aux"), log)
            elif event.get("id") == buildkit.IMAGE_ID and isinstance(event.get("aux"), dict):
                image_id = str(event["aux"].get("ID", ""))
            elif "stream" in event:
                log.write(self.secrets.redact(strip_ansi(str(event["stream"]))))
            self._fail_on_engine_error(event, log)
        return _built(image_id)

    def _fail_on_engine_error(self, event: dict, log) -> None:
        """The engine's error event ends the build: written to its log and raised (credentials redacted)."""
        if "error" in event:
            message = self.secrets.redact(strip_ansi(str(event["error"])))
            log.write(f"ERROR: {message}\n")
            raise BuildFailed(message.strip())

    def _write_trace(self, tag: str, plain: buildkit.PlainLog, aux: object, log) -> None:
        """One progress event into the log (as plain progress), and a Dockerfile step starting to the progress."""
        try:
            update = buildkit.decode_trace(aux)
        except buildkit.TraceError as unreadable:
            log.write(f"(an unreadable progress event: {unreadable})\n")
            return
        for vertex in update.vertexes:
            step = buildkit.step_of(vertex)
            if step and vertex.started is not None and vertex.completed is None:
                self.progress.step(tag, *step)
        lines = plain.lines(update)
        if lines:
            log.write(self.secrets.redact(strip_ansi("\n".join(lines) + "\n")))
            log.flush()

    def _observe(self, tag: str, text: str) -> None:
        step = STEP.match(text)
        if step:
            self.progress.step(tag, int(step.group(1)), int(step.group(2)))
        with self._lock:
            self._step_images.extend(STEP_IMAGE.findall(text))
        running = RUNNING_IN.search(text)
        if running:
            with self._lock:
                self._intermediate.add(running.group(1))
            if self.cancelled.is_set():
                self._remove_container(running.group(1))

    def _remove_intermediate_containers(self) -> None:
        for container_id in list(self._intermediate):
            self._remove_container(container_id)
        self._intermediate.clear()

    def _prune_build_stages(self) -> None:
        """Remove what this run's build stages left behind (the venv stage, a devel row's toolkit stage, the steps of
        a failed build). Only after every build of the run: a later flavor takes its layers from them.
        Removing an image some tagged image is built on fails, so only the stages' leftovers go."""
        for image_id in reversed(self._step_images):
            inspected = engine.inspect_image(self.client, image_id)
            if not inspected or inspected.get("RepoTags"):
                continue  # gone already, or a tagged image (the result, a base): `rmi ID` would untag it
            try:
                self.client.api.remove_image(image_id)
            except docker.errors.APIError:
                pass  # a layer of a tagged image, or already removed with a child
        self._step_images.clear()

    def _remove_container(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True)
        except docker.errors.APIError:
            pass  # already gone, or removed by the engine itself (rm/forcerm)

    def _fresh_layers(self, donor: Future | None) -> str | None:
        """The image of the row's first flavor, where it was built without the cache on this run."""
        built = donor.result() if donor is not None and not donor.cancelled() else None
        return self._fresh_layers_of(built.image_id if built and built.status == "built" else None)

    def _fresh_layers_of(self, image_id: str | None) -> str | None:
        # --no-cache means nothing from before this run, not that a row's builds share nothing: a later build of the
        # row (its devel flavor, or the image after its python stage was built for the server on the engine) takes
        # the layers this run just made for the steps they share, where the classic builder can be held to them: given
        # a cache source, it takes a cached step only from that image's own layers, so the steps it lacks (a devel
        # row's toolchain, the build stages) run again. BuildKit cannot be held so: it would take any cached layer.
        return image_id if self.options.no_cache and self.options.builder == "classic" and image_id else None

    def _cache_sources(self, spec: ImageSpec) -> list[str] | None:
        # Only when there is such an image: given any cache source, the engine's classic builder takes its own cached
        # layers only where they are parents of a source, so flavors sharing a build stage would stop sharing it.
        return [cache_name(spec)] if engine.inspect_image(self.client, cache_name(spec)) else None

    def _locked_image_id(self, spec: ImageSpec) -> str | None:
        # bases.lock.json sits beside the matrix, which (as images/) is the project's root.
        locked = read_lock(self.options.images_dir.parent / LOCK_NAME).get(spec.base_image)
        return locked.image_id if locked else None

    def _image_id(self, reference: str) -> str | None:
        inspected = engine.inspect_image(self.client, reference)
        return inspected["Id"] if inspected else None

    def _log_path(self, spec: ImageSpec) -> Path:
        return self.options.reports_dir / spec.tag / "build.log"

    def _running_log_path(self, spec: ImageSpec) -> Path:
        return self.options.reports_dir / spec.tag / "build.running.log"

    def _interrupted_log_path(self, spec: ImageSpec) -> Path:
        return self.options.reports_dir / spec.tag / "build.interrupted.log"

    def _log_paths(self, spec: ImageSpec) -> list[Path]:
        return [self._log_path(spec), self._running_log_path(spec), self._interrupted_log_path(spec)]


def _put_log_in_place(running: Path, final: Path) -> None:
    """The log of a build that ended, renamed to the name it keeps (its folder was checked for links before the
    build: check_destinations; a rename replaces a link at the name itself, never what it points to)."""
    try:
        os.replace(running, final)
    except FileNotFoundError:
        pass  # the build ended before its log was opened


class BuildFailed(TorchImagesError):
    """One row's build failed; the message says why (the other rows build on)."""


def _built(image_id: str) -> str:
    if not image_id:
        raise BuildFailed("the engine ended the build without an image")
    return image_id


def _build_error(error: Exception) -> str:
    """What failed a build, in words: the engine's own error, or the engine falling silent."""
    if isinstance(error, BuildFailed):
        return str(error)
    if isinstance(error, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)) or (
            isinstance(error, requests.exceptions.ConnectionError) and "timed out" in str(error)):
        return (f"the Docker engine at {engine.where()} sent nothing for {BUILD_SILENCE_S} s during the build: it is "
                "stuck or overloaded; check dockerd's log, and build again")
    return f"{type(error).__name__}: {error}"


def _failure(error: str, log_path: Path, tag: str) -> str:
    """The one line a failed build's error becomes: its cause and remedy, read from the build log and the engine's
    error (failure.py). The log keeps the rest: the console names it, and never repeats the step's whole command."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        text = ""
    if error and error not in text:
        # This host's own words (a build-input server that could not start, an engine fallen silent, a .deb pin
        # not kept): already a cause and a remedy, which the log's last step would hide.
        return " ".join(error.split())
    return failure_line(*diagnose(text, tag))


@dataclass
class BuildReportEntry(BuildResult):
    """An entry of reports/build-report.json: a row's last result, and how long its last real build took."""

    last_build_duration: float = 0.0


BUILD_REPORT = RowReport("build-report.json", BuildReportEntry, "build report",
                         "delete it: it only records past builds (shard plans then weigh every row the same)")


def write_report(reports_dir: Path, results: list[BuildResult]) -> Path:
    """Merge this run into reports/build-report.json, keeping entries of images not built this time.

    `last_build_duration` survives skipped runs: shard planning weighs rows by their real build time."""
    entries = BUILD_REPORT.read(reports_dir)
    for result in results:
        previous = entries.get(result.tag, {})
        last_build = result.duration if result.status == "built" else previous.get("last_build_duration", 0.0)
        entries[result.tag] = {**asdict(result), "last_build_duration": last_build}
    return BUILD_REPORT.write(reports_dir, entries)
