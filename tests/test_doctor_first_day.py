"""An installed user's first day (issue 57; newcomer trial 2, findings 1, 5 and 24, mistake M9b): `doctor` says
before a build whether the engine holds the rows' base images and whether the build gets their wheels (a wheelhouse
that holds them, or an index the build's pip reaches); `--wheelhouse DIR` never falls back to the network. Engine-
free: the indexes are local servers on 127.0.0.1."""
import json
import os
import socket
import ssl
import time

import pytest

from torchimages.build import builder, doctor, wheels
from torchimages.build.context import BuildOptions, wheel_dir
from torchimages.invocation import CLONE, running_as
from torchimages.matrix.load import load_matrix

from .conftest import FIXTURE_MATRIX, FIXTURE_PROJECT, run_cli
from .index_fixtures import LocalIndex
from .registry_fixtures import make_certificates

SPECS = load_matrix(FIXTURE_MATRIX).specs
BY_TAG = {spec.tag: spec for spec in SPECS}
CPU, CPU_DEVEL, CU132 = "2.13.0-cpu-runtime", "2.13.0-cpu-devel", "2.15.0-cuda13.2-cudnn9-runtime"
NO_ENGINE = "unix:///nonexistent/torchimages-test.sock"


def fill(wheelhouse, spec, *skip: str):
    """Wheel files named as `wheels` fetches them for spec (empty: only their names are read), less those in skip."""
    folder = wheel_dir(wheelhouse, spec)
    folder.mkdir(parents=True, exist_ok=True)
    for requirement in wheels.requirements(spec):
        name, _, version = requirement.partition("==")
        if name not in skip:
            (folder / f"{name.replace('-', '_')}-{version.rstrip('.*') or '1.0'}-cp311-cp311-linux_x86_64.whl").touch()
    return folder


def env(**extra) -> dict:
    # The probes go to 127.0.0.1 only: no proxy of the test host's may take them.
    return {**os.environ, "DOCKER_HOST": NO_ENGINE, "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1", **extra}


def doctor_json(*arguments: str) -> tuple[int, list[dict]]:
    result = run_cli("--project", str(FIXTURE_PROJECT), "doctor", *arguments, "--format", "json", env=env())
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def wheel_lines(findings: list[dict]) -> list[dict]:
    return [finding for finding in findings if finding["subject"] == "wheels"]


# ------------------------------------------------------------------------------------ the wheelhouse's coverage

def test_a_wheelhouse_covers_a_row_holding_a_wheel_of_each_requirement(tmp_path):
    fill(tmp_path, BY_TAG[CPU])
    assert wheels.wheelhouse_gaps(BY_TAG[CPU], tmp_path) == []
    assert wheels.uncovered_rows([BY_TAG[CPU], BY_TAG[CU132]], tmp_path) == [BY_TAG[CU132]]


def test_an_empty_wheelhouse_is_refused_in_the_trials_words(tmp_path):
    assert wheels.wheelhouse_refusal(BY_TAG[CU132], tmp_path) == (
        f"--wheelhouse {tmp_path} has no wheels for {CU132} (cu132-py3.11): run `torchimages wheels '{CU132}' --dest "
        f"{tmp_path}`")


def test_a_partial_folder_names_what_it_lacks(tmp_path):
    fill(tmp_path, BY_TAG[CPU], "numpy")
    assert wheels.wheelhouse_gaps(BY_TAG[CPU], tmp_path) == [f"numpy=={BY_TAG[CPU].numpy}"]
    assert f"(cpu-py3.11 lacks numpy=={BY_TAG[CPU].numpy})" in wheels.wheelhouse_refusal(BY_TAG[CPU], tmp_path)


def test_another_torch_build_does_not_cover_the_row(tmp_path):
    folder = fill(tmp_path, BY_TAG[CPU], "torch")
    (folder / "torch-2.13.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    assert wheels.wheelhouse_gaps(BY_TAG[CPU], tmp_path) == ["torch==2.13.0+cpu"]


def test_build_refuses_a_wheelhouse_without_the_rows_wheels_before_building(tmp_path):
    """M9b: `build '*-cpu-*' --wheelhouse emptydir` went to the public index and failed 25 s later. Now: exit 2 at
    once, a line per row, before the engine is asked anything (none answers here)."""
    empty = tmp_path / "emptydir"
    empty.mkdir()
    result = run_cli("--project", str(FIXTURE_PROJECT), "--reports", str(tmp_path / "reports"), "build", "*-cpu-*",
                     "--wheelhouse", str(empty), env=env())
    assert result.returncode == 2, result.stdout + result.stderr
    with running_as(CLONE):  # the CLI ran as build.py, and names itself so
        expected = [f"error: {empty}: {wheels.wheelhouse_refusal(BY_TAG[tag], empty)}" for tag in (CPU, CPU_DEVEL)]
    assert result.stderr.splitlines() == expected
    assert "no wheels for 2.13.0-cpu-runtime (cpu-py3.11): run `python build.py wheels '2.13.0-cpu-runtime' --dest" \
        in result.stderr
    assert not (tmp_path / "reports").exists()  # nothing built, no build report


def test_with_a_wheelhouse_the_builds_pip_is_given_no_index_even_without_served_wheels(tmp_path):
    options = BuildOptions(images_dir=tmp_path, reports_dir=tmp_path, wheelhouse=tmp_path / "wheelhouse")
    assert "no-index = true" in builder.pip_settings(BY_TAG[CPU], options, False, "token").splitlines()
    plain = BuildOptions(images_dir=tmp_path, reports_dir=tmp_path)
    assert "no-index = true" not in builder.pip_settings(BY_TAG[CPU], plain, False, "token").splitlines()


# --------------------------------------------------------------------------------------------- doctor's wheels

def test_doctor_says_a_wheelhouse_covers_a_row_or_how_to_fill_it(tmp_path):
    fill(tmp_path, BY_TAG[CPU])
    code, findings = doctor_json(CPU, CU132, "--wheelhouse", str(tmp_path))
    lines = wheel_lines(findings)
    assert code == 1 and [line["status"] for line in lines] == ["ok", "fail"]
    assert lines[0]["detail"] == f"{tmp_path}/cpu-py3.11 holds the wheels of {CPU}: the build needs no index"
    with running_as(CLONE):
        assert lines[1]["detail"] == wheels.wheelhouse_refusal(BY_TAG[CU132], tmp_path)


def test_doctor_probes_the_rows_indexes_and_finds_them_answering(tmp_path):
    with LocalIndex(tmp_path) as index:
        code, findings = doctor_json(CPU, "--pip-index-url", index.url, "--extra-index-url", index.url)
    [line] = wheel_lines(findings)
    assert line == {"subject": "wheels", "status": "ok", "detail": f"the build's pip reaches {index.url}, for {CPU}"}
    assert index.pages == {} or set(index.pages) <= {"torch", "numpy"}  # a HEAD of a project page, no more


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_doctor_fails_an_unreachable_index_naming_both_remedies():
    url = f"http://127.0.0.1:{closed_port()}/simple"
    code, findings = doctor_json(CPU, "--pip-index-url", url, "--extra-index-url", url)
    [line] = wheel_lines(findings)
    assert code == 1 and line["status"] == "fail"
    assert f"{url}: the connection was refused" in line["detail"]
    assert "--ca-bundle FILE" in line["detail"]
    assert f"`python build.py wheels '{CPU}' --dest DIR`) and build with --wheelhouse DIR" in line["detail"]


@pytest.fixture
def tls_index(tmp_path):
    """The local index over TLS, its certificate signed by a CA of the test's own: what a TLS-intercepting proxy
    looks like to a pip that does not trust its CA."""
    ca, certificate, key = make_certificates(tmp_path / "tls")
    with LocalIndex(tmp_path / "wheels") as index:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate, key)
        index.server.socket = context.wrap_socket(index.server.socket, server_side=True)
        yield index.url.replace("http://", "https://"), ca


def test_doctor_names_ca_bundle_for_an_index_behind_an_untrusted_certificate(tls_index):
    url, ca = tls_index
    code, findings = doctor_json(CPU, "--pip-index-url", url, "--extra-index-url", url)
    [line] = wheel_lines(findings)
    assert code == 1 and line["status"] == "fail"
    assert "its TLS certificate is not trusted" in line["detail"] and "pass --ca-bundle FILE" in line["detail"]
    code, findings = doctor_json(CPU, "--pip-index-url", url, "--extra-index-url", url, "--ca-bundle", str(ca))
    assert wheel_lines(findings)[0]["status"] == "ok"


def test_probes_end_within_their_bound_however_the_index_answers():
    """A probe still running at the bound (a name lookup that hangs) is "no answer", and doctor goes on."""
    answers = wheels.probe_all(["https://slow.example/simple/torch/", "https://fast.example/simple/torch/"],
                               lambda page: time.sleep(5) if "slow" in page else None, bound_s=0.3)
    assert answers == {"https://slow.example/simple/torch/": "no answer within 5 s",
                       "https://fast.example/simple/torch/": None}


def test_unreachable_reasons_point_at_their_fix():
    certificate = ssl.SSLCertVerificationError(1, "verify failed")
    certificate.verify_message = "self-signed certificate in certificate chain"
    assert wheels.unreachable_reason(certificate, 5).startswith("its TLS certificate is not trusted (self-signed")
    assert wheels.unreachable_reason(socket.gaierror(-2, "Name or service not known"), 5) == \
        "its host name does not resolve here"
    assert wheels.unreachable_reason(TimeoutError(), 5) == "no answer within 5 s"


# ----------------------------------------------------------------------------------------------- doctor's bases

def test_a_base_on_the_engine_is_named_with_its_id_and_a_missing_one_with_how_to_get_it(tmp_path):
    cpu, ubuntu = BY_TAG[CPU], next(spec for spec in SPECS if spec.base_image.startswith("ubuntu"))
    on_engine = {"debian:bookworm": "sha256:" + "a" * 64}
    [present, absent] = doctor.base_findings([cpu, BY_TAG[CPU_DEVEL], ubuntu], tmp_path / "not-rendered",
                                             on_engine.get)
    assert present.status == "ok" and present.detail == (f"debian:bookworm is on the engine (image sha256:aaaaaaaaaaa"
                                                         f"a), for {CPU}, {CPU_DEVEL}")
    assert absent.status == "fail"
    assert f"{ubuntu.base_image} is not on the engine, and {ubuntu.tag} builds FROM it" in absent.detail
    assert f"`docker pull {ubuntu.base_image}`" in absent.detail and '"Offline bases"' in absent.detail
    [missing] = doctor.base_findings([cpu], None, {}.get)
    assert missing.detail.endswith("with no registry, make it with `torchimages base debian:bookworm` (root, "
                                   "debootstrap)")


def test_the_rendered_dockerfiles_base_is_the_one_checked(tmp_path):
    """A lock-pinned base is what the build takes FROM: the rendered Dockerfile's, not the matrix's name."""
    pinned = "debian@sha256:" + "b" * 64
    (tmp_path / CPU).mkdir()
    (tmp_path / CPU / "Dockerfile").write_text(f"ARG BASE_IMAGE={pinned}\nFROM ${{BASE_IMAGE}}\n")
    asked = []
    [finding] = doctor.base_findings([BY_TAG[CPU]], tmp_path, lambda reference: asked.append(reference))
    assert asked == [pinned] and finding.status == "fail" and "pin it again (`torchimages lock`)" in finding.detail


def test_one_row_not_built_yet_is_one_row():
    assert "the row not built yet" in doctor.disk_finding(2**50, [BY_TAG[CU132]]).detail
    assert "the 2 rows not built yet" in doctor.disk_finding(2**50, [BY_TAG[CU132], BY_TAG[CPU]]).detail


def test_doctor_in_a_log_writes_wrapped_lines_not_a_wide_table(tmp_path):
    """Finding 24: a non-terminal got a table about 215 columns wide."""
    result = run_cli("--project", str(FIXTURE_PROJECT), "doctor", CPU, "--wheelhouse", str(tmp_path), env=env())
    lines = result.stdout.splitlines()
    assert result.returncode == 1 and lines[0].startswith("fail  engine: no Docker engine answers")
    assert all(len(line) <= 100 or " " not in line.strip() for line in lines), lines
    assert not any(character in result.stdout for character in "┏━│╭")
    assert any(line.startswith("fail  wheels: --wheelhouse") for line in lines)


def test_a_row_on_pypi_itself_gives_pip_one_index_not_the_same_one_twice(tmp_path):
    """Trial 2, finding 20: the CUDA row's build said "Looking in indexes: <PyPI>, <PyPI>" (its index and the extra
    one both PyPI)."""
    on_pypi = BuildOptions(images_dir=tmp_path, reports_dir=tmp_path, pip_index_url="https://pypi.org/simple")
    settings = builder.pip_settings(BY_TAG[CPU], on_pypi, False, "token").splitlines()
    assert "index-url = https://pypi.org/simple" in settings
    assert not [line for line in settings if line.startswith("extra-index-url")]
    own = builder.pip_settings(BY_TAG[CPU], BuildOptions(images_dir=tmp_path, reports_dir=tmp_path), False, "token")
    assert f"index-url = {BY_TAG[CPU].index_url}" in own and "extra-index-url = https://pypi.org/simple" in own
