"""The BuildKit builder's pure parts: its progress events read into a plain log, and the build request's parameters.

tests/data/buildkit/*.json are the events a real engine (dockerd 20.10, `make engine`) sent for two builds through
POST /build?version=2: ok.json for `FROM debian:bookworm AS base / ARG A / RUN echo hello $A && echo err >&2 /
FROM base / RUN echo two` (A=1), fail.json for `FROM debian:bookworm / RUN echo about to fail && exit 3`."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchimages.build import buildkit
from torchimages.build.builder import Builder, BuildFailed, BuildOptions, Progress

DATA = Path(__file__).parent / "data" / "buildkit"


def recorded(name: str) -> list[dict]:
    return json.loads((DATA / f"{name}.json").read_text())


def plain_log(events: list[dict]) -> list[str]:
    log = buildkit.PlainLog()
    return [line for event in events if event.get("id") == buildkit.TRACE_ID
            for line in log.lines(buildkit.decode_trace(event["aux"]))]


# A StatusResponse written by hand (control.proto's field numbers), for what the recorded builds do not show.
def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def field(number: int, value: bytes | int) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def trace(*, vertexes: tuple[bytes, ...] = (), logs: tuple[tuple[str, bytes], ...] = ()) -> dict:
    body = b"".join(field(1, vertex) for vertex in vertexes)
    body += b"".join(field(3, field(1, digest.encode()) + field(4, message)) for digest, message in logs)
    return {"id": buildkit.TRACE_ID, "aux": base64.b64encode(body).decode()}


def vertex(digest: str, name: str = "", started: int | None = None, completed: int | None = None) -> bytes:
    out = field(1, digest.encode()) + (field(3, name.encode()) if name else b"")
    out += field(5, field(1, started)) if started is not None else b""
    return out + (field(6, field(1, completed)) if completed is not None else b"")


def test_a_real_builds_events_read_as_docker_builds_plain_progress():
    lines = plain_log(recorded("ok"))
    assert "#5 [base 2/2] RUN echo hello 1 && echo err >&2" in lines
    assert lines.index("#5 hello 1") > lines.index("#5 [base 2/2] RUN echo hello 1 && echo err >&2")
    assert "#5 err" in lines and "#6 two" in lines and "#4 CACHED" in lines
    assert any(line.startswith("#6 DONE ") and line.endswith("s") for line in lines)
    assert lines.count("#5 [base 2/2] RUN echo hello 1 && echo err >&2") == 1  # a step's name once, as it repeats


def test_a_failed_step_ends_with_its_error_after_its_output():
    lines = plain_log(recorded("fail"))
    failed = "#5 ERROR: executor failed running [/bin/sh -c echo about to fail && exit 3]: exit code: 3"
    assert lines.index("#5 about to fail") < lines.index(failed)


def builder(tmp_path: Path, progress: Progress | None = None, **options) -> Builder:
    return Builder(None, BuildOptions(images_dir=tmp_path, reports_dir=tmp_path, **options), progress)  # type: ignore[arg-type]


class Steps(Progress):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []

    def step(self, tag: str, step: int, total: int) -> None:
        self.seen.append((tag, step, total))


def test_the_builder_takes_the_image_id_and_reports_each_dockerfile_step(tmp_path):
    steps, log = Steps(), io.StringIO()
    image = builder(tmp_path, steps)._read_buildkit_events("row", iter(recorded("ok")), log)
    assert image == "sha256:6efab60b5bb6574dd96ebb93612f0ccc34ee59f50b61b6fbdb2c16539f2154f8"
    assert ("row", 2, 2) in steps.seen and ("row", 1, 1) in steps.seen  # [base 2/2], then [stage-1 1/1]
    assert "#6 two\n" in log.getvalue() and "Successfully tagged bkapi:test\n" in log.getvalue()


def test_the_engines_error_fails_the_build_and_ends_its_log(tmp_path):
    log = io.StringIO()
    with pytest.raises(BuildFailed, match=r"executor failed running .*exit code: 3"):
        builder(tmp_path)._read_buildkit_events("row", iter(recorded("fail")), log)
    assert log.getvalue().endswith("exit code: 3\n") and "#5 about to fail\n" in log.getvalue()


def test_a_build_that_ends_without_an_image_fails(tmp_path):
    events = [event for event in recorded("ok") if event.get("id") != buildkit.IMAGE_ID]
    with pytest.raises(BuildFailed, match="without an image"):
        builder(tmp_path)._read_buildkit_events("row", iter(events), io.StringIO())


def test_credentials_in_a_steps_output_stay_out_of_the_log(tmp_path):
    """pip prints the index it looks in: a mirror's password must not reach the build log (as with the classic one)."""
    events = [trace(vertexes=(vertex("sha256:a", "[2/2] RUN pip install torch", started=1),),
                    logs=(("sha256:a", b"Looking in indexes: https://me:s3cret@mirror.example/simple\n"),)),
              {"id": buildkit.IMAGE_ID, "aux": {"ID": "sha256:1"}}]
    log = io.StringIO()
    builder(tmp_path, pip_index_url="https://me:s3cret@mirror.example/simple")._read_buildkit_events(
        "row", iter(events), log)
    assert "s3cret" not in log.getvalue() and "mirror.example" in log.getvalue()


def test_an_unreadable_progress_event_is_noted_and_the_build_goes_on(tmp_path):
    events = [{"id": buildkit.TRACE_ID, "aux": "not base64!"}, {"id": buildkit.TRACE_ID, "aux": {"a": 1}},
              {"id": buildkit.IMAGE_ID, "aux": {"ID": "sha256:1"}}]
    log = io.StringIO()
    assert builder(tmp_path)._read_buildkit_events("row", iter(events), log) == "sha256:1"
    assert log.getvalue().count("an unreadable progress event") == 2


def test_output_split_across_events_is_joined_into_its_lines():
    events = [trace(vertexes=(vertex("sha256:a", "[1/1] RUN x", started=5),), logs=(("sha256:a", b"Collecting to"),)),
              trace(logs=(("sha256:a", b"rch\nInstalling"),)),
              trace(vertexes=(vertex("sha256:a", "[1/1] RUN x", started=5, completed=7),))]
    assert plain_log(events) == ["#1 [1/1] RUN x", "#1 Collecting torch", "#1 Installing", "#1 DONE 2.0s"]


@given(st.binary(max_size=300))
def test_any_bytes_are_an_update_or_a_trace_error(payload):
    try:
        update = buildkit.decode_trace(base64.b64encode(payload).decode())
    except buildkit.TraceError:
        return
    buildkit.PlainLog().lines(update)  # and whatever it holds can be written


@pytest.mark.parametrize(("name", "step"), [("[venv 2/3] RUN python3.11 -m venv /opt/venv", (2, 3)),
                                            ("[4/9] COPY entrypoint.sh /usr/local/bin/", (4, 9)),
                                            ("[stage-2  4/10] RUN /opt/venv/bin/python -c", (4, 10)),
                                            ("[internal] load remote build context", None),
                                            ("exporting to image", None)])
def test_a_dockerfile_steps_number_is_read_from_its_name(name, step):
    assert buildkit.step_of(buildkit.Vertex("sha256:a", name)) == step


def test_the_build_request_asks_for_buildkit_with_only_what_is_given():
    params = buildkit.build_params(tag="r/p:t", target=None, build_args={"A": "1"}, labels={"l": "v"},
                                   network_mode="host", extra_hosts={"server": "10.0.0.2"}, cache_from=None,
                                   no_cache=True, pull=False, build_id="id-1")
    assert params["version"] == "2" and params["buildid"] == "id-1" and params["t"] == "r/p:t"
    assert json.loads(params["buildargs"]) == {"A": "1"} and json.loads(params["labels"]) == {"l": "v"}
    assert params["extrahosts"] == ["server:10.0.0.2"] and params["nocache"] is True
    assert "target" not in params and "cachefrom" not in params
