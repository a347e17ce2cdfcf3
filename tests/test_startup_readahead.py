"""startup-set --readahead-kib: the start-up set as a lazy-pull snapshotter's mount reads it (verify/snapshotter_view.py),
on the CPU runtime row, against the same start on the engine's own disk; and what it refuses."""
import json
import os
import subprocess

import pytest

from .conftest import FIXTURE_PROJECT, run_cli

RUNTIME = "2.13.0-cpu-runtime"
PROJECT = ("--project", str(FIXTURE_PROJECT))
LIBTORCH_CPU = "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"


def loop_devices_on(folder) -> list[str]:
    listed = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"], capture_output=True,
                            text=True, check=True).stdout
    return [line for line in listed.splitlines() if str(folder) in line]


def read_of(record: dict, path: str) -> int:
    return sum(end - start for start, end in record["files"][path]["ranges"])


def test_a_snapshotters_read_ahead_reads_less_of_a_mapped_library_and_leaves_nothing(cpu_images, tmp_path):
    """This VM's disk reads ahead 8 MiB (read_ahead_kb 8192): every page fault in libtorch_cpu brings 8 MiB around
    it. Read ahead 128 KiB, as stargz-snapshotter's FUSE mount does, the same start reads less of it, and still
    loads it (the set keeps what the start needs). The loop device, its mount and its file are gone afterwards."""
    disk, loop = tmp_path / "disk", tmp_path / "loop"
    run_cli(*PROJECT, "--reports", str(disk), "startup-set", RUNTIME, check_exit=0)
    result = run_cli(*PROJECT, "--reports", str(loop), "startup-set", RUNTIME, "--readahead-kib", "128", check_exit=0)
    assert "/usr and /opt reading ahead 128 KiB" in result.stdout
    on_disk = json.loads((disk / RUNTIME / "startup-set.json").read_text())
    snapshotter = json.loads((loop / RUNTIME / "startup-set.json").read_text())
    assert (on_disk["readahead_kib"], snapshotter["readahead_kib"]) == (None, 128)
    assert 0 < read_of(snapshotter, LIBTORCH_CPU) < read_of(on_disk, LIBTORCH_CPU)
    assert snapshotter["read_bytes"] < on_disk["read_bytes"]
    assert sorted(path.name for path in (loop / RUNTIME).iterdir()) == ["startup-set.json"]
    assert loop_devices_on(loop) == []


@pytest.mark.parametrize(("arguments", "says"), [
    (("--readahead-kib", "2"), "is not a read-ahead in KiB from 4"),
    (("--readahead-kib", "lots"), "is not a read-ahead in KiB from 4"),
])
def test_a_read_ahead_that_is_not_one_is_refused_in_one_line(arguments, says):
    result = run_cli(*PROJECT, "startup-set", RUNTIME, *arguments, check_exit=2)
    assert says in result.stderr and "Traceback" not in result.stderr


def test_an_engine_on_another_host_is_refused_before_anything_is_made(tmp_path):
    result = run_cli(*PROJECT, "--reports", str(tmp_path), "startup-set", RUNTIME, "--readahead-kib", "128", check_exit=2,
                     env={**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9"})
    assert "is not on this host" in result.stderr and "leave out --readahead-kib" in result.stderr
    assert list(tmp_path.iterdir()) == []
