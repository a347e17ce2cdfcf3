"""Hostile and unlucky file systems, streams and neighbours (issue 18): links, pipes and files where the tool's folders
and files belong, paths from the environment, two runs on one folder, shards that disagree, a full disk, closed or
full output streams, an ASCII-only locale and SIGTERM. No Docker engine: every command here reads and writes files.

Fast cases run build.py's main() in this process; the ones that need a process of their own (streams, signals,
resource limits, two runs racing) start build.py, each bounded so that a hang fails its test instead of the run."""
from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchimages.build.builder import base_reference
from torchimages.files import atomic_write, open_new
from torchimages.matrix.load import load_matrix
from torchimages.model import InputError

from .conftest import ROOT, wait_until
from .documents_fixtures import (
    DIGEST,
    ROW,
    Space,
    catalog_document,
    catalog_entry,
    lock_entry,
    refused,
    shard,
    without_proxies,
    write_json,
)

BOUND_S = 60  # a process still running after this hangs: its test fails saying so
SBOM = f"sbom/{ROW}-20260102.cdx.json"


@pytest.fixture
def space(tmp_path) -> Space:
    return make_space(tmp_path)


def make_space(tmp_path: Path) -> Space:
    """A Space in its own folder, so that what links point to (outside_folder) lies beside it, not in it."""
    (tmp_path / "space").mkdir()
    return Space(tmp_path / "space")


def full_shard(folder: Path, rows=(ROW,)) -> Path:
    """A shard with something in every destination merge writes: a row log, a catalog entry and its SBOM."""
    shard(folder, rows=rows)
    for row in rows:
        (folder / "reports" / row).mkdir()
        (folder / "reports" / row / "build.log").write_text(f"{row} built\n")
    write_json(folder / "catalog" / "catalog.json", catalog_document(*(catalog_entry(row) for row in rows)))
    for row in rows:
        write_json(folder / "catalog" / f"sbom/{row}-20260102.cdx.json", {"bomFormat": "CycloneDX", "row": row})
    return folder


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under folder with what it is: file contents, link targets; FIFOs and folders by kind."""
    seen = {}
    for path in sorted(folder.rglob("*")) if folder.exists() else []:
        relative = str(path.relative_to(folder))
        if path.is_symlink():
            seen[relative] = f"link to {os.readlink(path)}"
        elif path.is_fifo():
            seen[relative] = "fifo"
        elif path.is_dir():
            seen[relative] = "folder"
        else:
            seen[relative] = path.read_bytes().decode(errors="replace")
    return seen


def outside_folder(tmp_path: Path) -> Path:
    """What links in the tool's folders point to: it must never change."""
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True, exist_ok=True)
    (outside / "folder" / "keep.txt").write_text("keep me\n")
    (outside / "file.txt").write_text("keep me too\n")
    return outside


def build_py(*args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "build.py"), *args], env={**os.environ, **(env or {})},
                            stdin=subprocess.DEVNULL, **popen)


# build.py's main() with its modules loaded, saying so and waiting for a line on stdin: runs released together race.
AT_THE_LINE = ("import sys\nfrom torchimages.cli import main\nprint('ready', file=sys.stderr, flush=True)\n"
               "sys.stdin.readline()\nsys.exit(main(sys.argv[1:]))")


def racing(*commands: list[str]) -> list[tuple[int, str, str]]:
    runs = [subprocess.Popen([sys.executable, "-c", AT_THE_LINE, *command], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for command in commands]
    for run in runs:
        assert run.stderr.readline() == b"ready\n"
    for run in runs:
        run.stdin.write(b"go\n")
        run.stdin.flush()
    return [finished(run) for run in runs]


def finished(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        stdout, stderr = process.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"build.py still ran after {BOUND_S} s (it hangs); stderr so far:\n{stderr}")
    as_text = lambda data: data.decode(errors="replace") if isinstance(data, bytes) else (data or "")  # noqa: E731
    return process.returncode, as_text(stdout), as_text(stderr)


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    return stderr.strip()


# ------------------------------------------------------------------------------ class 2: links in destination folders

@pytest.mark.parametrize("where", ["reports/ROW", "catalog/sbom"])
def test_merge_refuses_a_linked_folder_in_its_destination_and_writes_nothing(space, tmp_path, where):
    outside = outside_folder(tmp_path)
    uploaded = full_shard(tmp_path / "shard")
    link = space.root / where.replace("ROW", ROW)
    link.parent.mkdir(parents=True)
    link.symlink_to(outside / "folder")
    before = snapshot(space.root)
    refused(space.merge(uploaded), link, "a link where a folder belongs")
    assert snapshot(outside) == snapshot(outside_folder(tmp_path)) and snapshot(space.root) == before


@pytest.mark.parametrize("where", [f"reports/{ROW}/build.log", f"catalog/{SBOM}"])
def test_merge_replaces_a_linked_file_in_its_destination_instead_of_writing_through_it(space, tmp_path, where):
    outside = outside_folder(tmp_path)
    uploaded = full_shard(tmp_path / "shard")
    link = space.root / where
    link.parent.mkdir(parents=True)
    link.symlink_to(outside / "file.txt")
    result = space.merge(uploaded)
    assert result.returncode == 0, result.stderr
    assert not link.is_symlink() and link.read_bytes() == (uploaded / where).read_bytes()
    assert (outside / "file.txt").read_text() == "keep me too\n"


def test_render_refuses_a_linked_tag_folder_and_replaces_a_linked_file(space, tmp_path):
    outside = outside_folder(tmp_path)
    assert space.cli("render").returncode == 0
    tag_folder = space.images / ROW
    dockerfile = space.images / "2.13.0-cpu-devel" / "Dockerfile"
    for path in tag_folder.iterdir():
        path.unlink()
    tag_folder.rmdir()
    tag_folder.symlink_to(outside / "folder")
    refused(space.cli("render"), tag_folder, "a link where a folder belongs")
    assert snapshot(outside) == snapshot(outside_folder(tmp_path))
    tag_folder.unlink()
    rendered = dockerfile.read_text()
    dockerfile.unlink()
    dockerfile.symlink_to(outside / "file.txt")
    assert space.cli("render").returncode == 0
    assert not dockerfile.is_symlink() and dockerfile.read_text() == rendered
    assert (outside / "file.txt").read_text() == "keep me too\n" and space.cli("render", "--check").returncode == 0


@pytest.mark.parametrize("kind", ["fifo", "endless"])
def test_render_replaces_a_pipe_or_device_where_a_rendered_file_was(space, kind):
    """render compares what is there with what it would write: a FIFO hung `render --check` (and `render`, reading
    each tag folder's header), a link to /dev/zero read without end. Both are simply not the rendered file."""
    assert space.cli("render").returncode == 0
    dockerfile = space.images / ROW / "Dockerfile"
    rendered = dockerfile.read_bytes()
    dockerfile.unlink()
    os.mkfifo(dockerfile) if kind == "fifo" else dockerfile.symlink_to("/dev/zero")
    global_flags = ("--matrix", str(space.matrix), "--images", str(space.images), "--reports", str(space.reports))
    code, _, stderr = finished(build_py(*global_flags, "render", "--check", stderr=subprocess.PIPE))
    assert code == 1 and str(dockerfile) in stderr
    code, _, stderr = finished(build_py(*global_flags, "render", stderr=subprocess.PIPE))
    assert code == 0, stderr
    assert not dockerfile.is_symlink() and dockerfile.read_bytes() == rendered


def test_render_names_a_folder_where_a_rendered_file_belongs(space):
    """What render compares may be a folder too: `render --check` calls it stale, render refuses it by name."""
    assert space.cli("render").returncode == 0
    dockerfile = space.images / ROW / "Dockerfile"
    dockerfile.unlink()
    dockerfile.mkdir()
    assert space.cli("render", "--check").returncode == 1
    refused(space.cli("render"), dockerfile, "a folder where a file belongs")


def test_a_build_refuses_a_rendered_dockerfile_that_is_a_pipe(space):
    """The build reads the Dockerfile's base before the engine is asked: a FIFO there hung it."""
    spec = next(spec for spec in load_matrix(space.matrix).specs if spec.tag == ROW)
    (space.images / ROW).mkdir(parents=True)
    os.mkfifo(space.images / ROW / "Dockerfile")
    with pytest.raises(InputError, match="not a regular file"):
        base_reference(spec, space.images)


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "folder"])
def test_an_allowlist_that_is_not_a_regular_file_is_refused_saying_so(space, tmp_path, kind):
    """publish --allowlist FIFO said it "does not exist"; it is there, and not a file the tool reads."""
    allowlist = tmp_path / "allowlist.yaml"
    if kind == "fifo":
        os.mkfifo(allowlist)
    elif kind == "folder":
        allowlist.mkdir()
    else:
        allowlist.symlink_to("/dev/zero")
    messages = refused(space.cli("publish", ROW, "--registry", "127.0.0.1:9/x", "--allowlist", str(allowlist)),
                       str(allowlist))
    assert "does not exist" not in messages


def test_wheels_refuse_a_linked_row_folder_in_the_wheelhouse(space, tmp_path):
    """pip downloads into <wheelhouse>/<index>-py<python>/: a link there took 200 MB of wheels elsewhere."""
    outside = outside_folder(tmp_path)
    wheelhouse = space.root / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "cpu-py3.11").symlink_to(outside / "folder")
    refused(space.cli("wheels", ROW, "--dest", str(wheelhouse), "--pip-index-url", "http://127.0.0.1:9/simple"),
            "cpu-py3.11", "a link where a folder belongs")
    assert snapshot(outside) == snapshot(outside_folder(tmp_path))


def test_prune_refuses_a_linked_sbom_folder_before_the_registry_is_touched(space, tmp_path, fake_registry):
    registry, deletes = fake_registry
    outside = outside_folder(tmp_path)
    write_json(space.catalog / "catalog.json", catalog_document(catalog_entry()))
    (space.catalog / "sbom").symlink_to(outside / "folder")
    result = space.cli("prune", ROW, "--retention", "1", "--registry", registry, "--catalog", str(space.catalog),
                       env=without_proxies())
    refused(result, space.catalog / "sbom", "a link where a folder belongs")
    assert deletes == [] and snapshot(outside) == snapshot(outside_folder(tmp_path))


def test_a_build_log_replaces_a_link_and_refuses_a_linked_row_folder(tmp_path):
    """What the builder and the check suite open their logs with (files.open_new), on the paths they use."""
    outside = outside_folder(tmp_path)
    reports = tmp_path / "reports"
    (reports / ROW).mkdir(parents=True)
    (reports / ROW / "build.log").symlink_to(outside / "file.txt")
    with open_new(reports / ROW / "build.log", reports) as log:
        log.write("step 1/9\n")
    assert (reports / ROW / "build.log").read_text() == "step 1/9\n" and not (reports / ROW / "build.log").is_symlink()
    (reports / "other").symlink_to(outside / "folder")
    with pytest.raises(InputError, match="a link where a folder belongs"):
        atomic_write(reports / "other" / "build.log", "x", root=reports)
    assert snapshot(outside) == snapshot(outside_folder(tmp_path))


# ------------------------------------------------------------------------------ class 6: GITHUB_STEP_SUMMARY

def test_a_step_summary_that_is_a_fifo_or_in_a_missing_folder_is_refused_before_the_merge(space, tmp_path):
    uploaded = full_shard(tmp_path / "shard")
    fifo = tmp_path / "summary-fifo"
    os.mkfifo(fifo)
    for step_summary in (fifo, tmp_path / "no-such-folder" / "summary.md"):
        with FifoGuard(tmp_path) as guard:
            result = space.cli("report", "merge", str(uploaded), "--catalog", str(space.catalog),
                               env={"GITHUB_STEP_SUMMARY": str(step_summary)})
        assert not guard.unblocked, "merge waited on the FIFO"
        assert result.returncode == 2 and f"GITHUB_STEP_SUMMARY={step_summary}" in one_line(result.stderr)
        assert not space.reports.exists() and not space.catalog.exists()
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    result = space.cli("report", "merge", str(uploaded), "--catalog", str(space.catalog),
                       env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 0 and summary.read_text().startswith("# earlier step\n# Nightly images")


# ------------------------------------------------------------------------------ class 7: two runs on one folder

def merge_args(space: Space, uploaded: Path) -> list[str]:
    return ["--matrix", str(space.matrix), "--images", str(space.images), "--reports", str(space.reports),
            "report", "merge", str(uploaded), "--catalog", str(space.catalog)]


def test_two_merges_racing_into_one_folder_keep_both_shards(space, tmp_path):
    rows = [spec.tag for spec in load_matrix(space.matrix).specs if not spec.is_gpu][:2]
    shards = [full_shard(tmp_path / f"shard-{index}", rows=[row]) for index, row in enumerate(rows)]
    for uploaded, row in zip(shards, rows, strict=False):  # long logs to copy: each merge reads the reports long before it writes
        (uploaded / "reports" / row / "build.log").write_bytes(b"step\n" * 2**21)
    outcomes = racing(*(merge_args(space, uploaded) for uploaded in shards))
    assert [code for code, _, _ in outcomes] == [0, 0], outcomes
    merged = json.loads((space.reports / "build-report.json").read_text())
    assert sorted(entry["tag"] for entry in merged["images"]) == sorted(rows)
    assert sorted(json.loads((space.catalog / "catalog.json").read_text())["images"]) == sorted(rows)


def test_two_renders_racing_into_one_folder_leave_it_rendered(space):
    args = ["--matrix", str(space.matrix), "--images", str(space.images), "--reports", str(space.reports), "render"]
    outcomes = racing(args, args)
    assert [code for code, _, _ in outcomes] == [0, 0], outcomes
    assert space.cli("render", "--check").returncode == 0


def test_catalog_then_render_into_a_new_images_folder_both_work(space):
    """`catalog` writes its page into a new images folder; render then refused the folder as someone else's, so a
    render racing a catalog on a fresh checkout failed whenever the catalog took the folder first."""
    assert space.cli("catalog").returncode == 0
    assert space.cli("render").returncode == 0 and space.cli("render", "--check").returncode == 0
    assert space.cli("catalog", "--check").returncode == 0
    fresh = ["--matrix", str(space.matrix), "--images", str(space.root / "fresh-images")]
    first, second = racing([*fresh, "catalog"], [*fresh, "render"])
    assert first[0] == 0 and second[0] == 0, (first, second)


def test_a_run_waits_a_bounded_time_for_another_then_names_it(space, tmp_path):
    uploaded = full_shard(tmp_path / "shard")
    space.reports.mkdir(parents=True)
    holder = os.open(space.reports, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # this test is the other run
        merging = space.cli("report", "merge", str(uploaded), "--catalog", str(space.catalog),
                            env={"TORCHIMAGES_LOCK_WAIT": "0.2"})
        errors = refused(merging, space.reports.resolve(), f"pid {os.getpid()}", "TORCHIMAGES_LOCK_WAIT")
        assert "another run writes here" in errors
        assert snapshot(space.reports) == {} and not space.catalog.exists()
    finally:
        os.close(holder)
    refused(space.cli("render", env={"TORCHIMAGES_LOCK_WAIT": "soon"}), "TORCHIMAGES_LOCK_WAIT='soon'")


# ------------------------------------------------------------------------------ class 8: shards that disagree

def test_shards_pinning_one_base_to_different_digests_are_refused_naming_both(space, tmp_path):
    by_base: dict[str, list[str]] = {}
    for spec in load_matrix(space.matrix).specs:
        by_base.setdefault(spec.base_image, []).append(spec.tag)
    base, rows = next((base, rows) for base, rows in by_base.items() if len(rows) >= 2)
    digests = [DIGEST, "sha256:" + "d" * 64]
    shards = []
    for index, (row, digest) in enumerate(zip(rows, digests, strict=False)):
        uploaded = full_shard(tmp_path / f"shard-{index}", rows=[row])
        write_json(uploaded / "bases.lock.json", {"schema": 1, "bases": {base: lock_entry(base, digest)}})
        shards.append(uploaded)
    refused(space.merge(*shards), shards[0] / "bases.lock.json", shards[1] / "bases.lock.json", *digests, base)
    assert not space.reports.exists() and not space.catalog.exists() and not space.lock.exists()


# ------------------------------------------------------------------------------ class 10: file system and streams

def test_shards_published_to_different_registries_are_refused_naming_both(space, tmp_path):
    """The merged summary names one registry: it took the first shard's while another's rows went elsewhere."""
    first = shard(tmp_path / "shard-1", rows=[ROW])
    other = shard(tmp_path / "shard-2", rows=["2.13.0-cpu-devel"], registry="registry.example.com/ml/pytorch")
    refused(space.merge(first, other), other / "reports" / "nightly-summary.json", "registry.example.com/ml/pytorch",
            "127.0.0.1:5000/ml/pytorch")
    assert not space.reports.exists() and not space.catalog.exists()


def test_a_file_where_a_row_folder_belongs_is_refused_naming_it(space, tmp_path):
    uploaded = full_shard(tmp_path / "shard")
    (space.reports).mkdir(parents=True)
    (space.reports / ROW).write_text("a file\n")
    refused(space.merge(uploaded), space.reports / ROW, "a file where a folder belongs")
    assert snapshot(space.reports) == {ROW: "a file\n"}


def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing_half_written(space, tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: the write fails part-way (EFBIG) as it would with ENOSPC."""
    uploaded = full_shard(tmp_path / "shard")
    (uploaded / "reports" / ROW / "build.log").write_text("x" * 2**20)
    write_json(space.reports / "build-report.json", {"schema": 1, "images": []})
    before = snapshot(space.root)

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**16, 2**16))

    code, _, stderr = finished(build_py(*merge_args(space, uploaded), preexec_fn=small_disk,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    line = one_line(stderr)
    assert code == 1 and str(space.reports / ROW / "build.log") in line and "EFBIG" in line
    assert snapshot(space.root) == {**before, f"reports/{ROW}": "folder"}  # no temporary, no half file


def can_mount() -> bool:
    """Whether this host lets a process mount a tmpfs in a mount namespace of its own (root, or a user namespace)."""
    probe = "mount -t tmpfs -o size=64k tmpfs /mnt"
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True, check=False).returncode == 0 \
        if shutil.which("unshare") else False


def on_tmpfs(options: str, folder: Path, *args: str) -> tuple[int, str, str]:
    """build.py with a fresh tmpfs mounted (options: ro, size=...) at folder, in a mount namespace of its own:
    nothing outside that process sees the file system, and it goes with it."""
    script = 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"'
    return finished(subprocess.Popen(["unshare", "-m", "sh", "-c", script, "sh", options, str(folder), sys.executable,
                                      str(ROOT / "build.py"), *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE))


@pytest.mark.skipif(not can_mount(), reason="this host does not let a test mount a file system")
def test_a_read_only_folder_or_a_really_full_disk_is_one_line_naming_the_file(space, tmp_path):
    space.images.mkdir()
    code, _, stderr = on_tmpfs("ro", space.images, "--matrix", str(space.matrix), "--images", str(space.images),
                               "render")
    line = one_line(stderr)
    assert code == 2 and f"error: {space.images}/" in line and "Read-only file system (EROFS)" in line
    uploaded = full_shard(tmp_path / "shard")
    (uploaded / "reports" / ROW / "build.log").write_text("x" * 2**20)
    space.reports.mkdir()
    code, _, stderr = on_tmpfs("size=256k", space.reports, *merge_args(space, uploaded))
    line = one_line(stderr)
    assert code == 1 and str(space.reports / ROW / "build.log") in line and "ENOSPC" in line


def run_list(space: Space, **popen) -> tuple[int, str, str]:
    return finished(build_py("--matrix", str(space.matrix), "list", stderr=subprocess.PIPE, **popen))


def test_stdout_full_closed_or_a_closed_pipe_is_one_line_naming_it(space):
    with open("/dev/full", "wb") as full:
        code, _, stderr = run_list(space, stdout=full)
    assert code == 1 and "<stdout>" in one_line(stderr) and "ENOSPC" in stderr
    reader, writer = os.pipe()
    os.close(reader)  # nobody will read: every write is EPIPE
    try:
        code, _, stderr = run_list(space, stdout=writer)
    finally:
        os.close(writer)
    assert code == 1 and "<stdout>" in one_line(stderr) and "EPIPE" in stderr
    code, _, stderr = run_list(space, preexec_fn=lambda: os.close(1))
    assert code == 2 and "stdout: closed (EBADF)" in one_line(stderr)


def test_an_ascii_only_locale_escapes_what_it_cannot_print(space):
    ascii_only = {"PYTHONIOENCODING": "ascii", "LC_ALL": "C"}
    images = space.root / "bilder-\u00fc"
    code, stdout, stderr = finished(build_py("--matrix", str(space.matrix), "--images", str(images), "render",
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ascii_only))
    assert code == 0 and "bilder-\\xfc" in stdout and not stderr, stderr
    matrix = space.root / "matrize-\u00fc.yaml"
    code, _, stderr = finished(build_py("--matrix", str(matrix), "list", stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=ascii_only))
    assert code == 2 and "matrize-\\xfc.yaml" in one_line(stderr)


# ------------------------------------------------------------------------------ class 11: SIGTERM

def test_sigterm_while_waiting_is_exit_143_in_one_line(space):
    space.images.mkdir(parents=True)
    holder = os.open(space.images, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        process = build_py("--matrix", str(space.matrix), "--images", str(space.images), "render",
                           env={"TORCHIMAGES_LOCK_WAIT": "600"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_until(lambda: holds_open(process.pid, space.images), "render opening the images folder to lock it")
        process.terminate()
        code, _, stderr = finished(process)
    finally:
        os.close(holder)
    assert code == 143 and one_line(stderr) == "terminated"


# A pip that has written half of a wheel where it was told to, says so, and waits: a fetch cancelled mid-copy.
HALF_A_WHEEL_PIP = """import sys, time
from pathlib import Path
dest = Path(sys.argv[sys.argv.index("--dest") + 1])
(dest / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"PK half a wheel")
Path(sys.argv[0]).with_name("copying").touch()
time.sleep(120)
"""


def test_sigterm_while_pip_copies_a_wheel_leaves_no_truncated_wheel(space, tmp_path):
    """`images --wheelhouse` takes a folder holding torch-*.whl as fetched: a truncated one from a cancelled fetch
    would have been built from, and failed there."""
    (tmp_path / "fake" / "pip").mkdir(parents=True)
    (tmp_path / "fake" / "pip" / "__init__.py").write_text("")  # a regular package: it comes before the real pip
    (tmp_path / "fake" / "pip" / "__main__.py").write_text(HALF_A_WHEEL_PIP)
    wheelhouse = space.root / "wheelhouse"
    run = build_py("--matrix", str(space.matrix), "wheels", ROW, "--dest", str(wheelhouse),
                   env={"PYTHONPATH": str(tmp_path / "fake")}, stderr=subprocess.PIPE)
    wait_until(lambda: (tmp_path / "fake" / "pip" / "copying").exists() or run.poll() is not None, "pip copying")
    run.send_signal(signal.SIGTERM)
    code, _, stderr = finished(run)
    assert code == 143 and one_line(stderr.split("\n", 1)[1]) == "terminated"
    assert list((wheelhouse / "cpu-py3.11").iterdir()) == []


def holds_open(pid: int, folder: Path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(folder.resolve()) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


@settings(max_examples=2, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(delay=st.floats(min_value=0.0, max_value=0.5))
def test_sigterm_at_any_moment_of_a_render_leaves_no_temporary(tmp_path_factory, delay):
    """SIGTERM at any moment once render has started (its images folder is there): exit 143 (0 when it came after
    the last write, or the signal's own status once main() has returned), and no temporary left."""
    space = make_space(tmp_path_factory.mktemp("sigterm"))
    args = ["--matrix", str(space.matrix), "--images", str(space.images), "render"]
    process = build_py(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: space.images.exists() or process.poll() is not None, "render starting")
    threading.Timer(delay, process.terminate).start()
    code, _, stderr = finished(process)
    assert code in (0, 143, -signal.SIGTERM) and "Traceback" not in stderr, stderr
    if code == -signal.SIGTERM:  # it came after main() returned, as the interpreter exited: the work was all done
        assert space.cli("render", "--check").returncode == 0
    assert not [name for name in snapshot(space.images) if name.endswith(".tmp")]
    assert space.cli("render").returncode == 0 and space.cli("render", "--check").returncode == 0


# ------------------------------------------------------------------------------ property: any layout of destinations

DESTINATIONS = (f"reports/{ROW}", f"reports/{ROW}/build.log", "catalog/sbom", f"catalog/{SBOM}",
                "reports/build-report.json", "reports/nightly-summary.md", "catalog/catalog.json")
KINDS = ("nothing", "link to a folder", "link to a file", "fifo", "file", "folder")


def place(root: Path, relative: str, kind: str, outside: Path) -> None:
    """kind at root/relative, unless something placed earlier (a link, a file) stands where a folder above it goes."""
    path, folder = root / relative, root
    for part in Path(relative).parent.parts:
        folder = folder / part
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            return
        folder.mkdir(exist_ok=True)
    if kind == "nothing" or os.path.lexists(path):
        return
    if kind == "link to a folder":
        path.symlink_to(outside / "folder")
    elif kind == "link to a file":
        path.symlink_to(outside / "file.txt")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "file":
        path.write_text("someone's file\n")
    else:
        path.mkdir()


class FifoGuard:
    """Opens every FIFO under a folder once a bound has passed, so that a command stuck opening one returns (and
    its test fails saying so) instead of hanging this process."""

    def __init__(self, folder: Path):
        self.folder, self.unblocked, self.done = folder, [], threading.Event()
        self.thread = threading.Thread(target=self._guard, daemon=True)

    def _guard(self) -> None:
        if self.done.wait(BOUND_S):
            return
        for path in self.folder.rglob("*"):
            if path.is_fifo():
                os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
                self.unblocked.append(path)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.lists(st.sampled_from(KINDS), min_size=len(DESTINATIONS), max_size=len(DESTINATIONS)))
def test_merge_keeps_the_contract_whatever_lies_in_its_destination(tmp_path_factory, layout):
    """Links, FIFOs, files and folders anywhere merge writes: exit 0 or 2, never a traceback or a hang, nothing
    outside changed, and on exit 0 every file written is a regular file."""
    tmp_path = tmp_path_factory.mktemp("layout")
    space, outside = make_space(tmp_path), outside_folder(tmp_path)
    uploaded = full_shard(tmp_path / "shard")
    for relative, kind in zip(DESTINATIONS, layout, strict=False):
        place(space.root, relative, kind, outside)
    with FifoGuard(space.root) as guard:
        result = space.merge(uploaded)
    assert not guard.unblocked, f"merge waited on {guard.unblocked}"
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr, result.stderr
    assert snapshot(outside) == snapshot(outside_folder(tmp_path))
    if result.returncode == 0:
        for relative in (f"reports/{ROW}/build.log", f"catalog/{SBOM}", "reports/build-report.json",
                         "catalog/catalog.json"):
            assert (space.root / relative).is_file() and not (space.root / relative).is_symlink(), relative


# ------------------------------------------------------------------------------ with a Docker engine: build

def tiny_build(tmp_path: Path, body: str) -> tuple[list[str], Path]:
    """build.py arguments building one CPU row from a one-step Dockerfile, and its reports folder."""
    from .build_fixtures import tiny_matrix

    matrix, images, reports = tiny_matrix(tmp_path), tmp_path / "images", tmp_path / "reports"
    (images / ROW).mkdir(parents=True)
    (images / ROW / "Dockerfile").write_text(f"FROM debian:bookworm\n{body}\nLABEL io.torchimages.torch=x\n")
    return ["--matrix", str(matrix), "--images", str(images), "--reports", str(reports), "build", ROW], reports


@pytest.mark.engine
def test_a_build_replaces_a_linked_build_log_and_refuses_a_linked_row_folder(engine_env, tmp_path):
    from .conftest import run_cli

    outside = outside_folder(tmp_path)
    args, reports = tiny_build(tmp_path, f"RUN echo building {ROW}")
    (reports / ROW).mkdir(parents=True)
    (reports / ROW / "build.log").symlink_to(outside / "file.txt")
    result = run_cli(*args, "--force", "--no-cache")
    assert result.returncode == 0, result.stderr
    log = reports / ROW / "build.log"
    assert not log.is_symlink() and f"building {ROW}" in log.read_text()
    for path in (reports / ROW).iterdir():
        path.unlink()
    (reports / ROW).rmdir()
    (reports / ROW).symlink_to(outside / "folder")
    refused(run_cli(*args, "--force"), reports / ROW, "a link where a folder belongs")
    assert snapshot(outside) == snapshot(outside_folder(tmp_path))


@pytest.mark.engine
def test_sigterm_stops_a_build_as_ctrl_c_does(engine_env, docker_client, tmp_path):
    token = f"torchimages-sigterm-test-{os.getpid()}"  # finds this test's containers, whatever else the engine runs

    def sleepers():  # sparse: no inspect of each container, which another test on the engine may remove meanwhile
        return [c for c in docker_client.containers.list(all=True, sparse=True) if token in c.attrs.get("Command", "")]

    args, reports = tiny_build(tmp_path, f"RUN echo {token} && sleep 600")
    process = build_py(*args, "--no-cache", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: any(c.attrs.get("State") == "running" for c in sleepers()), "the build's RUN container running")
    process.terminate()
    code, _, stderr = finished(process)
    assert code == 143 and "Traceback" not in stderr, stderr
    wait_until(lambda: not sleepers(), "the cancelled build's container being removed", timeout_s=60)
    assert not [path for path in reports.rglob("*.tmp")]
