"""The engine's BuildKit, driven through the Docker API (stage 3's other builder): the build request's parameters, and
its progress (`moby.buildkit.trace` events: base64 protobuf `StatusResponse`s, moby/buildkit
api/services/control/control.proto) read into the plain log `docker build --progress=plain` writes.

The Docker SDK's `build()` only drives the classic builder; the engine's /build endpoint runs BuildKit when asked
with `version=2`, takes the context as the request's tar body (no client session) and cancels by build id."""
from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..model import PeerError

TRACE_ID = "moby.buildkit.trace"
IMAGE_ID = "moby.image.id"
# A Dockerfile step's vertex: "[venv 2/3] RUN ..." (a named stage), "[2/3] RUN ..." (an unnamed one); the number is
# padded to the width of the total: "[stage-2  4/10] RUN ...".
STEP_NAME = re.compile(r"^\[(?:\S+)? *([0-9]+)/([0-9]+)\] ", re.ASCII)


@dataclass(frozen=True)
class Vertex:
    """One step's state as an update reports it (control.proto `Vertex`)."""

    digest: str
    name: str = ""
    cached: bool = False
    started: float | None = None
    completed: float | None = None
    error: str = ""


@dataclass(frozen=True)
class VertexLog:
    """Output of a step (control.proto `VertexLog`)."""

    vertex: str
    message: bytes


@dataclass(frozen=True)
class StatusUpdate:
    vertexes: list[Vertex] = field(default_factory=list)
    logs: list[VertexLog] = field(default_factory=list)


class TraceError(PeerError):
    """A trace event that is not a StatusResponse (the builder notes it in the log and reads on)."""


def build_params(*, tag: str | None, target: str | None, build_args: dict[str, str], labels: dict[str, str] | None,
                 network_mode: str, extra_hosts: dict[str, str], cache_from: list[str] | None, no_cache: bool,
                 pull: bool, build_id: str) -> dict:
    """The query of POST /build for a BuildKit build (the Docker Engine API's ImageBuild parameters)."""
    params: dict = {"version": "2", "buildid": build_id, "buildargs": json.dumps(build_args),
                    "networkmode": network_mode, "nocache": no_cache, "pull": pull, "rm": True, "forcerm": True}
    optional = {"t": tag, "target": target, "labels": json.dumps(labels) if labels else None,
                "cachefrom": json.dumps(cache_from) if cache_from else None,
                "extrahosts": [f"{host}:{address}" for host, address in extra_hosts.items()] or None}
    params.update({name: value for name, value in optional.items() if value is not None})
    return params


def decode_trace(aux: object) -> StatusUpdate:
    """A trace event's payload (base64 of a StatusResponse) as vertexes and logs; a TraceError for anything else."""
    if not isinstance(aux, str):
        raise TraceError("a trace event without base64 text")
    try:
        response = base64.b64decode(aux, validate=True)
    except binascii.Error as error:
        raise TraceError(f"not base64: {error}") from None
    update = StatusUpdate()
    for number, value in _fields(response):
        if number == 1 and isinstance(value, bytes):
            update.vertexes.append(_vertex(value))
        elif number == 3 and isinstance(value, bytes):
            update.logs.append(_log(value))
    return update


def _vertex(data: bytes) -> Vertex:
    values: dict = {}
    for number, value in _fields(data):
        if number == 1:
            values["digest"] = _text(value)
        elif number == 3:
            values["name"] = _text(value)
        elif number == 4:
            values["cached"] = bool(value)
        elif number in (5, 6) and isinstance(value, bytes):
            values["started" if number == 5 else "completed"] = _timestamp(value)
        elif number == 7:
            values["error"] = _text(value)
    return Vertex(**{"digest": "", **values})


def _log(data: bytes) -> VertexLog:
    values = dict(_fields(data))
    message = values.get(4, b"")
    return VertexLog(_text(values.get(1, b"")), message if isinstance(message, bytes) else b"")


def _timestamp(data: bytes) -> float:
    values = dict(_fields(data))
    seconds, nanos = values.get(1, 0), values.get(2, 0)
    return (seconds if isinstance(seconds, int) else 0) + (nanos if isinstance(nanos, int) else 0) / 1e9


def _text(value: int | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else ""


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one protobuf message: varints as int, length-delimited fields as bytes
    (fixed-width fields are skipped: no field read here has one)."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _varint(data, position)
            yield number, value
        elif wire_type == 2:
            size, position = _varint(data, position)
            if position + size > len(data):
                raise TraceError("a field runs past the end of its message")
            yield number, data[position:position + size]
            position += size
        elif wire_type in (1, 5):
            position += 8 if wire_type == 1 else 4
        else:
            raise TraceError(f"wire type {wire_type} of field {number}")


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise TraceError("a varint runs past the end of its message")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if not byte & 0x80:
            return value, position


class PlainLog:
    """A build's updates as `docker build --progress=plain` prints them: `#N <step>`, its output lines `#N <line>`,
    then `#N CACHED`, `#N DONE 1.2s` or `#N ERROR: <why>`. Steps are numbered in the order they first appear."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}
        self._named: set[str] = set()
        self._ended: set[str] = set()
        self._partial: dict[str, str] = {}

    def lines(self, update: StatusUpdate) -> list[str]:
        lines: list[str] = []
        for vertex in update.vertexes:
            number = self._numbers.setdefault(vertex.digest, len(self._numbers) + 1)
            if vertex.name and vertex.digest not in self._named:
                self._named.add(vertex.digest)
                lines.append(f"#{number} {vertex.name}")
            if vertex.digest in self._ended:
                continue
            ending = self._ending(vertex)
            if ending:
                self._ended.add(vertex.digest)
                lines += self._flush(vertex.digest) + [f"#{number} {ending}"]
        for log in update.logs:
            number = self._numbers.setdefault(log.vertex, len(self._numbers) + 1)
            text = self._partial.pop(log.vertex, "") + log.message.decode(errors="replace")
            *complete, rest = text.replace("\r\n", "\n").split("\n")
            lines += [f"#{number} {line}" for line in complete]
            if rest:
                self._partial[log.vertex] = rest
        return lines

    @staticmethod
    def _ending(vertex: Vertex) -> str:
        if vertex.error:
            return f"ERROR: {vertex.error}"
        if vertex.cached:
            return "CACHED"
        if vertex.completed is not None:
            return f"DONE {max(0.0, vertex.completed - (vertex.started or vertex.completed)):.1f}s"
        return ""

    def _flush(self, digest: str) -> list[str]:
        rest = self._partial.pop(digest, "")
        return [f"#{self._numbers[digest]} {rest}"] if rest else []


def step_of(vertex: Vertex) -> tuple[int, int] | None:
    """(step, steps in its stage) of a Dockerfile step's vertex; None for BuildKit's own (context, metadata, export)."""
    match = STEP_NAME.match(vertex.name)
    return (int(match.group(1)), int(match.group(2))) if match else None
