"""Failures said in one line (issue 57, newcomer trial 2 findings 2, 3, 17, 21, 21a, 22, 25): a failed build's cause and
remedy read from its log (recorded pip and Docker output in tests/data/build-failures/), the security gate's refusal
with counts and the remedy that fits, no terminal escapes where output is not a terminal, `wheels` naming each wheel
and where it came from, and `plan` estimating a never-built row by its kind. Pure logic: no engine, no network."""
from __future__ import annotations

import datetime as dt
import io
import sys
from pathlib import Path

import pytest

from torchimages.build import failure, wheels
from torchimages.build.builder import BuildResult, _failure
from torchimages.cli.display import PlainProgress, failure_lines
from torchimages.cli.streams import NamedStream
from torchimages.matrix.load import load_matrix
from torchimages.nightly.plan import KIND_SECONDS, balance, kind_estimates
from torchimages.security import freshness
from torchimages.security import gate as security_gate
from torchimages.security.sbom import Allowlist, parse_inventory

from .conftest import FIXTURE_MATRIX

DATA = Path(__file__).resolve().parent / "data" / "build-failures"
TAG = "2.13.0-cpu-runtime"
WHEELS = f"`torchimages wheels '{TAG}' --dest DIR`, then build with --wheelhouse DIR"


def diagnosed(name: str) -> tuple[str, str]:
    return failure.diagnose((DATA / name).read_text(), TAG)


# ------------------------------------------------------------------------------------------ a failed build's line

@pytest.mark.parametrize(("log", "cause", "remedy"), [
    ("pip-tls-verification.log",
     "pip could not fetch torch==2.13.0+cpu (TLS verification failed: self-signed certificate in certificate chain)",
     "--ca-bundle FILE"),
    ("pip-name-resolution.log", "pip could not fetch torch==2.13.0+cpu (host not resolved)", WHEELS),
    ("pip-connection-refused.log", "pip could not fetch torch==2.13.0+cpu (127.0.0.1 refused the connection)", WHEELS),
    ("pip-no-matching-distribution.log", "pip could not fetch torch==2.13.0+cpu (no such version on "
                                         "https://mirror.example.internal/simple", WHEELS),
    ("pull-access-denied.log", "base image nvidia/cuda:13.2.0-cudnn-runtime-ubuntu24.04 is not on the engine",
     "`docker pull nvidia/cuda:13.2.0-cudnn-runtime-ubuntu24.04`"),
    ("no-such-image.log", "base image debian:bookworm is not on the engine", "Offline bases"),
    # Recorded from an engine test (2026-11-29): another process's --prune-build-stages mid-build. Not the base.
    ("stage-removed.log", "the image of its build stage `entrypoint` was removed while the build ran", "build it again"),
    ("apt-name-resolution.log", "apt could not resolve its mirror deb.debian.org", "HTTP_PROXY"),
])
def test_each_recorded_failure_gets_its_cause_and_remedy(log, cause, remedy):
    found_cause, found_remedy = diagnosed(log)
    assert found_cause.startswith(cause) and remedy in found_remedy, (found_cause, found_remedy)


def test_tls_and_an_unresolved_host_in_one_log_get_both_remedies():
    """The trial's own case: the proxy's TLS to the public index, and PyTorch's host not resolved."""
    cause, remedy = diagnosed("pip-tls-and-name-resolution.log")
    assert "TLS verification failed" in cause and "host not resolved" in cause
    assert "--ca-bundle FILE" in remedy and WHEELS in remedy


@pytest.mark.parametrize("log", ["step-failed.log", "buildkit-step-failed.log"])
def test_another_failure_names_its_step_shortened_and_its_last_output(log):
    cause, remedy = diagnosed(log)
    assert "`RUN echo about to break && exit 3`" in cause and "returned a non-zero code: 3" in cause
    assert cause.endswith("its last output: about to break") and remedy == ""


@pytest.mark.parametrize("log", sorted(path.name for path in DATA.glob("*.log")))
def test_the_line_never_repeats_the_run_command_and_has_no_escapes(log):
    line = failure.failure_line(*diagnosed(log))
    assert "\n" not in line and "\x1b" not in line and len(line) < 500, line
    assert "--uninstall-replaced" not in line  # a word deep in the 900-character RUN line


def test_the_build_result_error_is_the_line_and_a_host_error_stays_its_own(tmp_path):
    log = tmp_path / "build.log"
    log.write_text(failure.strip_ansi((DATA / "pip-tls-verification.log").read_text()))
    engine_said = next(line for line in log.read_text().splitlines() if line.startswith("ERROR: "))[len("ERROR: "):]
    assert _failure(engine_said, log, TAG).endswith("give the TLS-intercepting proxy's CA with --ca-bundle FILE")
    stuck = "the Docker engine at unix:///x sent nothing for 3600 s during the build: it is stuck"
    assert _failure(stuck, log, TAG) == stuck, "this host's own error, not the log's last step"
    assert _failure("", tmp_path / "missing.log", TAG)  # an unreadable log: still a line, not a crash


def test_escape_codes_go_but_the_text_stays():
    assert failure.strip_ansi("\x1b[0m\x1b[91mERROR: x\x1b]0;title\x07 y\x1b[2J") == "ERROR: x y"


def test_failure_lines_name_the_log_once_and_never_an_empty_path():
    failed = BuildResult(TAG, "failed", error="pip could not fetch torch: fix it", log="reports/2.13.0-cpu-runtime/build.log")
    unstarted = BuildResult("2.15.0-cpu-runtime", "failed", error="base image debian:bookworm is not on the engine")
    built = BuildResult("x", "built", log="reports/x/build.log")
    assert failure_lines([failed, unstarted, built], terminal=False) == [
        f"{TAG} failed: pip could not fetch torch: fix it; full log: reports/2.13.0-cpu-runtime/build.log",
        "2.15.0-cpu-runtime failed: base image debian:bookworm is not on the engine"]
    # On a terminal the path has a line of its own: a table's column would cut it.
    assert failure_lines([failed], terminal=True) == [f"{TAG} failed: pip could not fetch torch: fix it",
                                                      "  full log: reports/2.13.0-cpu-runtime/build.log"]


def test_plain_progress_says_the_status_and_leaves_the_cause_to_the_summary():
    from rich.console import Console
    out = io.StringIO()
    PlainProgress(Console(file=out, width=200)).finished(BuildResult(TAG, "failed", duration=3.0, error="why",
                                                                      log="l"))
    assert out.getvalue() == f"{TAG}: failed (3.0s)\n"


def test_a_stream_that_is_not_a_terminal_gets_no_escapes(monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    plain = io.StringIO()
    NamedStream(plain, "<stdout>").write("\x1b[91mred\x1b[0m text\n")
    assert plain.getvalue() == "red text\n"
    monkeypatch.setenv("FORCE_COLOR", "1")
    forced = io.StringIO()
    NamedStream(forced, "<stdout>").write("\x1b[91mred\x1b[0m")
    assert forced.getvalue() == "\x1b[91mred\x1b[0m"


# ------------------------------------------------------------------------------------------ the security gate

def fixable(count: int, cves_each: int = 100, since: str = "2026-03-01") -> freshness.RowSecurity:
    """A row as the trial's hand-made base was: many packages, thousands of CVEs."""
    items = [freshness.Fixable(f"pkg{index}", "amd64", "1.0-1", "1.0-1+deb12u1",
                               tuple(f"CVE-2026-{index:02d}{cve:03d}" for cve in range(cves_each)),
                               since if index == 0 else "2026-06-01") for index in range(count)]
    return freshness.RowSecurity(TAG, "debian12", "bookworm-security index", "verified", items)


def test_the_refusal_is_one_short_line_of_counts_packages_and_age():
    verdict = security_gate.judge([fixable(23)], Allowlist((), path="scanner-allowlist.yaml"), dt.date(2026, 11, 25))
    assert verdict.status == "failed" and len(verdict.blocking) == 23
    message = verdict.message
    assert "\n" not in message and len(message) < 600, message
    assert message.startswith("23 OS packages lack security fixes (2300 CVEs): pkg0 1.0-1 -> 1.0-1+deb12u1; ")
    assert "and 20 more" in message and "oldest fix dated 2026-03-01 (269 days)" in message
    assert "CVE-2026-00001" not in message, "every CVE goes to the report, not the line"
    assert f"rebuild the row (`torchimages build {TAG} --force`) to take the fixes" in message
    assert sum(finding.id.count("CVE-") for finding in verdict.blocking) == 2300  # all kept for the report


def test_without_the_security_suite_the_refusal_says_a_rebuild_cannot_help():
    verdict = security_gate.judge([fixable(2)], Allowlist(()), dt.date(2026, 11, 25), missing_suite="bookworm-security")
    assert "the image's apt sources have no bookworm-security suite" in verdict.message
    assert "Offline bases" in verdict.message and "--force" not in verdict.message


def test_the_merged_verdict_does_not_double_its_prefix():
    from torchimages.security.sbom import ScanResult
    passed = ScanResult("passed", "bookworm-security index", "bookworm-security index: no unallowed fixable OS updates")
    merged = security_gate.merge([passed])
    assert merged.message == "judged by bookworm-security index: no unallowed fixable OS updates"


def test_the_inventory_reads_the_apt_suites_and_the_gate_finds_the_missing_one():
    inventory = parse_inventory("### os-release\nID=debian\n### apt-suites\nbookworm\nbookworm bookworm-updates\n"
                                "### pip\n")
    assert inventory.apt_suites == ["bookworm", "bookworm-updates"]
    assert parse_inventory("### os-release\nID=debian\n### pip\n").apt_suites is None  # not read: nothing claimed
    checker = freshness.Checker({"os": {"debian12": {"family": "debian", "security": {
        "url": "http://deb.debian.org/debian-security", "suite": "bookworm-security", "components": ["main"]}}},
        "families": {"debian": {"security": {"index": "deb"}}}}, "compat.yaml")
    assert security_gate.lacking_suite(checker, "debian12", inventory.apt_suites) == "bookworm-security"
    assert security_gate.lacking_suite(checker, "debian12", [*inventory.apt_suites, "bookworm-security"]) == ""
    assert security_gate.lacking_suite(checker, "debian12", None) == ""


# ------------------------------------------------------------------------------------------ wheels and plan

@pytest.mark.parametrize(("pip_line", "shown"), [
    ("  Downloading https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl "
     "(185.2 MB)\n", "  torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl (185.2 MB) from download.pytorch.org"),
    ("  Downloading numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl (16.9 MB)\n",
     "  numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl (16.9 MB) from files.pythonhosted.org"),
    ("  Using cached filelock-3.20.0-py3-none-any.whl (16 kB)\n", "  filelock-3.20.0-py3-none-any.whl (16 kB) from pip's cache"),
    ("Processing /srv/wheels/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl\n",
     "  torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl from /srv/wheels"),
    ("Collecting torch==2.13.0+cpu\n", None),
    ("Saved ./torch-2.13.0+cpu.whl\n", None),
])
def test_wheels_says_each_wheel_with_its_size_and_source(pip_line, shown):
    assert wheels.progress_line(pip_line) == shown


def test_wheels_reads_pips_lines_as_they_come_and_keeps_its_errors(monkeypatch):
    said: list[str] = []
    script = ("import sys; print('  Downloading https://h.example/simple/a-1-py3-none-any.whl (1.0 kB)', flush=True); "
              "print('pip failed', file=sys.stderr); sys.exit(1)")
    result = wheels._pip_said([sys.executable, "-c", script], {}, said.append)
    assert said == ["  a-1-py3-none-any.whl (1.0 kB) from h.example"]
    assert result.returncode == 1 and "pip failed" in result.stderr
    monkeypatch.setattr(wheels, "FETCH_BOUND_S", 0.5)
    with pytest.raises(wheels.subprocess.TimeoutExpired):
        wheels._pip_said([sys.executable, "-c", "import time; time.sleep(30)"], {}, said.append)


def test_a_never_built_cuda_row_is_not_weighed_by_a_cpu_rows_build():
    specs = load_matrix(FIXTURE_MATRIX).specs
    cpu = next(spec for spec in specs if not spec.is_gpu and spec.flavor == "runtime")
    cuda = next(spec for spec in specs if spec.is_gpu and spec.flavor == "runtime")
    estimates = kind_estimates([cpu, cuda], {cpu.tag: 219.2})
    assert estimates == {cuda.tag: KIND_SECONDS[("cuda", "runtime")]}
    shards = balance([cpu.tag, cuda.tag], {cpu.tag: 219.2}, 2, estimates=estimates)
    assert [shard.estimated_seconds for shard in shards] == [KIND_SECONDS[("cuda", "runtime")], 219.2]
    assert [shard.estimated_by_kind for shard in shards] == [(cuda.tag,), ()], "the plan says which are estimates"
