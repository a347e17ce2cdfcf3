"""Reruns that respect the work done (issue 57): the rows each command takes when it names none, a passing
verification kept for the same image id, an up-to-date build said so, an interrupted build's log kept apart, an
image given by `test --image` verified apart from the row's own, and `why` on a build that had a wheelhouse. Pure
decisions and engine-free CLI runs on the fixture project: no image is built, no container run."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from torchimages.build.builder import Builder, BuildOptions, BuildResult, _put_log_in_place, status_words
from torchimages.build.context import input_hash
from torchimages.checks.selection import CheckSelection
from torchimages.cli.rows import host_rows, leaving_line, publishable_rows
from torchimages.matrix.load import load_matrix
from torchimages.nightly.why import (
    FROM_INDEX,
    FROM_WHEELHOUSE,
    RowState,
    build_reasons,
    decision,
    explain,
    publish_reasons,
    wheel_source_change,
)
from torchimages.publish.catalog import CatalogEntry, PinnedTag
from torchimages.verify import emulation
from torchimages.verify.plan import CHECKS, IMAGE_FOLDER_MAX, Plan, VerifyOptions, image_folder, parse_gpus
from torchimages.verify.reports import REPORT_NAME, CheckVerdict, VerifyReport
from torchimages.verify.reuse import reusable, reuse_line
from torchimages.verify.run import kept_verifications

from .conftest import FIXTURE_PROJECT, run_cli_in_process

SPECS = load_matrix(FIXTURE_PROJECT / "matrix.yaml").specs
GRACE = load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs
CPU = [spec.tag for spec in SPECS if not spec.is_gpu]
GPU = [spec.tag for spec in SPECS if spec.is_gpu]
BY_TAG = {spec.tag: spec for spec in SPECS}
RUNTIME = "2.13.0-cpu-runtime"
IMAGE_ID = "sha256:" + "0050c955af26" + "0" * 52


# ----------------------------------------------------------------------------------- 1. the rows taken by default

def test_without_a_gpu_runtime_the_host_takes_the_cpu_rows_and_names_the_gpu_rows_it_leaves():
    taken, lines = host_rows(SPECS, "x86_64", gpu_runtime=False)
    assert [spec.tag for spec in taken] == CPU
    [line] = lines
    assert line.startswith("no NVIDIA runtime on this Docker engine: taking the CPU rows")
    assert all(tag in line for tag in GPU) and "name them to take them anyway" in line


def test_with_a_gpu_runtime_every_row_for_the_machine_is_taken_silently():
    taken, lines = host_rows(SPECS, "x86_64", gpu_runtime=True)
    assert taken == list(SPECS) and lines == []


def test_another_machines_rows_are_left_with_one_line_saying_why():
    taken, lines = host_rows(GRACE, "aarch64", gpu_runtime=True)
    assert {spec.platform for spec in taken} == {"linux/arm64"}
    [line] = lines
    assert "another machine's images build and verify here only under emulation" in line


def test_publish_takes_the_verified_rows_and_names_each_it_leaves_once():
    refusals = {tag: None for tag in CPU} | {tag: "no image localhost:5000/ml/pytorch:x on the engine: build it first"
                                             for tag in GPU}
    taken, left = publishable_rows(SPECS, refusals)
    assert [spec.tag for spec in taken] == CPU and sorted(left) == sorted(GPU)
    line = leaving_line(taken, left)
    assert line.startswith(f"publishing the verified rows ({', '.join(CPU)}), leaving {len(GPU)}")
    assert "build it first" not in line, "the remedy of a missing image is left out: the cause says it"
    assert all(line.count(f"{tag}: ") == 1 for tag in GPU)
    assert leaving_line(*publishable_rows(SPECS, dict.fromkeys(BY_TAG))) == ""


def test_a_multi_arch_row_is_published_with_all_its_machines_or_none():
    arm = next(spec for spec in GRACE if spec.platform == "linux/arm64")
    own = next(spec for spec in GRACE if spec.tag == arm.index_tag)
    refusals = {spec.tag: None for spec in GRACE} | {arm.tag: "never verified (x is missing): run it"}
    taken, left = publishable_rows(GRACE, refusals)
    assert own not in taken and arm not in taken and f"also names {arm.tag}" in left[own.tag]


def test_publish_without_a_selector_says_its_default_in_its_help():
    shown = run_cli_in_process("--project", str(FIXTURE_PROJECT), "publish", "--help").stdout
    assert "passed its verification" in " ".join(shown.split())
    build = " ".join(run_cli_in_process("--project", str(FIXTURE_PROJECT), "build", "--help").stdout.split())
    assert "the rows for the engine's machine" in build


# ------------------------------------------------------------------------------------- 2. a verification kept

def plan(**changes) -> Plan:
    return replace(Plan(BY_TAG[RUNTIME], "localhost:5000/ml/pytorch:" + RUNTIME, IMAGE_ID, parse_gpus("none"), "2g",
                        300), **changes)


def report(**changes) -> VerifyReport:
    passed = VerifyReport(
        image_id=IMAGE_ID, passed=True, checks={name: CheckVerdict("passed") for name in CHECKS}, tag=RUNTIME,
        spec_hash=BY_TAG[RUNTIME].spec_hash(),
        run={"gpus": "none", "shm_size": "2g", "probe_timeout_s": 300, "cpu_identity": emulation.cpu_identity_note(0)},
        finished_at="2026-11-28T14:03:12Z")
    return replace(passed, **changes)


def test_a_passing_verification_of_the_same_image_the_same_way_is_kept():
    assert reusable(report(), plan(), CheckSelection())


@pytest.mark.parametrize("changed", [
    {"image_id": "sha256:" + "1" * 64},  # rebuilt since
    {"passed": False},
    {"spec_hash": "other"},  # another version of the matrix row
    {"selection": {"only": ["hygiene"]}},  # some checks only
    {"run": {"gpus": "all", "shm_size": "2g", "cpu_identity": emulation.cpu_identity_note(0)}},  # with GPUs
    {"run": {"gpus": "none", "shm_size": "64m", "cpu_identity": emulation.cpu_identity_note(0)}},
    {"checks": {"identity": CheckVerdict("passed")}},  # made by a toolkit with other checks
])
def test_a_verification_made_otherwise_is_run_again(changed):
    assert not reusable(report(**changed), plan(), CheckSelection())


def test_a_selective_run_keeps_a_selective_verification_of_the_same_checks():
    only = CheckSelection(only=("hygiene",))
    assert reusable(report(selection=only.to_json()), plan(), only)
    assert not reusable(report(), plan(), only)


def test_the_kept_verification_is_read_back_and_said_with_its_date_and_image(tmp_path):
    folder = tmp_path / RUNTIME
    folder.mkdir()
    (folder / REPORT_NAME).write_text(json.dumps(report().to_json()))
    options = VerifyOptions(reports_dir=tmp_path)
    [kept] = kept_verifications([plan()], options).values()
    assert kept.passed and kept.image_id == IMAGE_ID and kept.report_dir == folder
    assert reuse_line(kept) == (f"{RUNTIME}: verification reused: passed on 2026-11-28 14:03:12 UTC for "
                                "sha256:0050c955af26 (--force to run it again)")
    (folder / REPORT_NAME).write_text("{damaged")
    assert kept_verifications([plan()], options) == {}, "a report that cannot be read is run again, not refused"


def test_the_test_command_takes_force():
    shown = " ".join(run_cli_in_process("--project", str(FIXTURE_PROJECT), "test", "--help").stdout.split())
    assert "--force" in shown and "passed (kept by default)" in shown


# -------------------------------------------------------------------- 3. up to date, and an interrupted build

def test_an_unchanged_build_is_up_to_date_with_its_image_id_not_skipped():
    assert status_words(BuildResult(RUNTIME, "skipped", image_id=IMAGE_ID)) == "up to date (sha256:0050c955af26)"
    assert status_words(BuildResult(RUNTIME, "built", image_id=IMAGE_ID)) == "built"


def test_an_interrupted_builds_log_goes_beside_the_last_finished_builds_log(tmp_path):
    row = tmp_path / RUNTIME
    row.mkdir()
    (row / "build.log").write_text("the last good build\n")
    (row / "build.running.log").write_text("Step 3/9 : RUN pip install\n")
    _put_log_in_place(row / "build.running.log", row / "build.interrupted.log")
    assert (row / "build.log").read_text() == "the last good build\n"
    assert (row / "build.interrupted.log").read_text().startswith("Step 3/9") and not (row / "build.running.log").exists()
    (row / "build.running.log").write_text("a finished build\n")
    _put_log_in_place(row / "build.running.log", row / "build.log")
    assert (row / "build.log").read_text() == "a finished build\n"
    _put_log_in_place(row / "build.running.log", row / "build.log")  # a build that ended before its log: nothing


def test_an_interrupted_run_says_which_previous_image_each_row_kept(tmp_path):
    building = Builder(None, BuildOptions(images_dir=tmp_path / "images", reports_dir=tmp_path))  # type: ignore[arg-type]
    devel = BY_TAG["2.13.0-cpu-devel"]
    building._todo, building._previous = [BY_TAG[RUNTIME], devel], {RUNTIME: IMAGE_ID}
    building._ended = {RUNTIME: "cancelled"}
    line = building.interrupted_line()
    assert line.startswith(f"build interrupted: {RUNTIME}: the previous image sha256:0050c955af26 was kept, and its "
                           f"build.log (this build's log: {tmp_path / RUNTIME / 'build.interrupted.log'})")
    assert f"{devel.tag}: no image, none before (not started)" in line
    building._ended = {RUNTIME: "built", devel.tag: "built"}
    assert building.interrupted_line() == ""


# ------------------------------------------------------------------------ 4. `test --image` kept apart

@pytest.mark.parametrize("reference", ["127.0.0.1:5077/ml/pytorch:2.13.0-cpu-runtime-20261128",
                                       "pytorch/pytorch@sha256:" + "ab" * 32, "../../etc", "a" * 300])
def test_an_image_given_by_reference_has_its_own_folder_under_the_row(reference, tmp_path):
    name = image_folder(reference)
    assert name.startswith("image-") and len(name) <= IMAGE_FOLDER_MAX and "/" not in name and ":" not in name
    assert name == image_folder(reference), "the same folder each time"
    folder = plan(folder=name).report_dir(tmp_path)
    assert folder.parent == tmp_path / RUNTIME and folder != tmp_path / RUNTIME
    assert plan().report_dir(tmp_path) == tmp_path / RUNTIME


def test_two_long_references_that_differ_at_the_end_get_two_folders():
    assert image_folder("r" * 200 + ":1") != image_folder("r" * 200 + ":2")


# --------------------------------------------------------------------------- 5. `why` without the build's wheelhouse

WHEELS = {f"wheel {name}": "1000 bytes" for name in ("torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
                                                     "numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.whl")}
OTHERS = {"file Dockerfile": "1" * 64, "index PIP_INDEX_URL": "https://download.pytorch.org/whl/cpu",
          "base": "debian@sha256:" + "b" * 64}
SERVED = {**OTHERS, **WHEELS}


def why_state(now: dict[str, str], built: dict[str, str] = SERVED) -> RowState:
    entry = CatalogEntry(
        tag=RUNTIME, repository="127.0.0.1:5077/ml/pytorch", digest="sha256:" + "a" * 64, image_id=IMAGE_ID,
        pinned=[PinnedTag(f"{RUNTIME}-20261128", "sha256:" + "a" * 64, "2026-11-28", "sbom.json")], floating=[RUNTIME],
        versions={}, size=1, download_size=1, checks={}, scan={}, sbom="sbom.json", published_at="", updated_at="",
        input_hash=input_hash(built))
    return RowState(tag=RUNTIME, inputs=now, input_hash=input_hash(now), built_inputs=built,
                    engine_hash=input_hash(built), entry=entry, entry_matches_row=True,
                    repository="127.0.0.1:5077/ml/pytorch", signing_key=None, registry_digests=None, forced=False)


def test_inputs_that_differ_only_in_where_the_wheels_come_from_are_said_so():
    assert wheel_source_change(SERVED, OTHERS) == FROM_WHEELHOUSE
    assert wheel_source_change(OTHERS, SERVED) == FROM_INDEX
    assert wheel_source_change(SERVED, SERVED) == ""
    assert wheel_source_change(SERVED, {**OTHERS, "file Dockerfile": "2" * 64}) == "", "another change is a change"
    assert wheel_source_change(SERVED, {**OTHERS, "wheel torch-2.14.0.whl": "1 bytes"}) == "", "other wheels"


def test_why_without_the_builds_wheelhouse_says_to_pass_it_not_to_rebuild():
    without = why_state(OTHERS)
    assert decision(without) == FROM_WHEELHOUSE
    shown = explain(without)
    assert shown.startswith(f"{RUNTIME}: inputs differ only in where the wheels come from: pass --wheelhouse as the "
                            "build did") and "removed wheel" not in shown and "rebuild" not in shown
    assert publish_reasons(without), "the nightly given these flags would still run the row"
    assert build_reasons(without) == [f"the engine's image was built with the same inputs, but {FROM_WHEELHOUSE}"]
    assert decision(why_state(SERVED)) == "nothing", "with the wheelhouse (any folder holding them): nothing"


def test_each_changed_input_is_listed_once():
    changed = why_state({**OTHERS, "file Dockerfile": "2" * 64})
    shown = explain(changed)
    assert all(shown.count(f"removed {name}") == 1 for name in WHEELS), shown
    assert "built from other inputs (the changes above)" in shown

