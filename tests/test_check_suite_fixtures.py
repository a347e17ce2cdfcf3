"""The image checks run on the pytest a user's pipx resolves (newcomer trial 2, finding 16): pytest 9 deprecates, and
10 removes, session fixtures defined as a plugin class's methods, which the suite's data fixtures once were; the
suite's own fixtures are module-level now, and pyproject.toml keeps pytest below its next major."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from torchimages.matrix.load import load_matrix
from torchimages.verify.plan import SUITE, parse_gpus
from torchimages.verify.suite import suite_arguments

from .conftest import FIXTURE_MATRIX, ROOT

CPU = "2.13.0-cpu-runtime"


def test_the_suite_runs_with_pytests_removals_as_errors(tmp_path):
    """The suite's driver test on recorded facts (testinfra's local:// host: it reads no file), every deprecation
    pytest 10 acts on an error: the expect, spec and facts fixtures set up without one."""
    [spec] = [spec for spec in load_matrix(FIXTURE_MATRIX).specs if spec.tag == CPU]
    paths = {name: tmp_path / f"{name}.json" for name in ("expect", "facts", "checks")}
    paths["expect"].write_text(json.dumps({"tag": CPU, "container_id": "recorded", "spec": spec.to_json(),
                                           "host_gpu_runtime": False, "gpus": parse_gpus("none").to_json()}))
    paths["facts"].write_text(json.dumps({"image": {"labels": {}}, "main": {"torch": {"importable": True}}}))
    arguments = suite_arguments([SUITE / "test_gpu.py"], "local://", paths["expect"], paths["facts"], paths["checks"])
    run = subprocess.run([sys.executable, "-m", "pytest", *arguments, "-k", "test_host_driver_meets_the_cuda_minimum",
                          "-W", "error::pytest.PytestRemovedIn10Warning", "-q"], capture_output=True, text=True,
                         timeout=120, check=False, cwd=ROOT)  # ROOT first on sys.path: its package
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "RemovedIn10" not in run.stdout + run.stderr
    assert json.loads(paths["checks"].read_text())["driver"]["status"] in ("passed", "skipped")


def test_pytest_is_kept_below_its_next_major():
    [pytest_requirement] = re.findall(r'^\s*"pytest([<>=][^"]*)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert "<10" in pytest_requirement.split(","), "a pytest major removes what the suite may lean on: bound it"
