"""YAML's constructors, tried as an attacker would (issue 45's fifth hostile-input round; docs/hostile-input.md,
"The new code"): a constructor's error, a top-level set, dates and the node bound in the matrix, compatibility data and
allowlist are one line at their line, in seconds."""
from __future__ import annotations

from pathlib import Path

import pytest

from torchimages import yamlsource
from torchimages.model import InputError

CONSTRUCTOR_TRAPS = ["!!int abc", "2026-02-30", "!!bool maybe", "!!set [a]", "!!timestamp x", "!!map [1]",
                     "!!seq {a: 1}", "!!int 0x", "!!int " + "9" * 5000]


@pytest.mark.parametrize("value", CONSTRUCTOR_TRAPS)
def test_every_constructor_error_is_one_line_at_its_line(value):
    with pytest.raises(InputError) as raised:
        yamlsource.parse_yaml(f"first: 1\nsecond: {value}\n", Path("m.yaml"))
    [problem] = raised.value.problems
    assert (problem.file, problem.line) == ("m.yaml", 2) and "is not a valid" in problem.message
    assert len(str(problem)) < 300


def test_a_top_level_set_is_one_line():
    with pytest.raises(InputError) as raised:
        yamlsource.parse_yaml("!!set [a]\n", Path("m.yaml"))
    assert raised.value.problems[0].line == 1


@pytest.mark.parametrize("value", ["!!int abc", "2026-02-30", "!!bool maybe", "!!set [a]"])
def test_constructor_errors_in_the_matrix_and_compat_data_are_exit_2_naming_the_file(tmp_path, value):
    from .conftest import copy_fixture_project, run_cli_in_process
    matrix = copy_fixture_project(tmp_path / "project")
    compat = matrix.with_name("compat.yaml")
    compat.write_text(compat.read_text() + f"extra_fact: {value}\n")
    refused = run_cli_in_process("--matrix", str(matrix), "list")
    assert refused.returncode == 2 and f"{compat}:" in refused.stderr and "Traceback" not in refused.stderr
    compat.unlink()
    copy_fixture_project(tmp_path / "again")
    matrix = tmp_path / "again" / "matrix.yaml"
    matrix.write_text(matrix.read_text() + f"extra: {value}\n")
    refused = run_cli_in_process("--matrix", str(matrix), "list")
    assert refused.returncode == 2 and f"{matrix}:" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("expires", ["2026-02-30", "!!int abc", "2026-12-31 10:00:00", "2026-12-31T10:00:00Z"])
def test_allowlist_expiry_is_a_date_and_nothing_else(tmp_path, expires):
    from torchimages.security.sbom import load_allowlist
    path = tmp_path / "scanner-allowlist.yaml"
    path.write_text(f"allow:\n  - cve: CVE-2026-12345\n    reason: not reachable\n    expires: {expires}\n")
    with pytest.raises(InputError) as raised:
        load_allowlist(path)
    [problem] = raised.value.problems
    assert problem.file == str(path) and problem.line == 4, str(problem)


def test_the_node_bound_holds_while_composing(monkeypatch):
    monkeypatch.setattr(yamlsource, "MAX_NODES", 1000)
    text = "".join(f"- {n}\n" for n in range(100_000))
    with pytest.raises(InputError) as raised:
        yamlsource.parse_yaml(text, Path("m.yaml"))
    [problem] = raised.value.problems
    assert 900 < problem.line < 1100, str(problem)  # where the bound was crossed, not after the whole file


def test_a_16_mib_file_of_values_is_refused_in_seconds():
    import time
    text = "[" + "1," * (8 << 20) + "1]\n"
    started = time.monotonic()
    with pytest.raises(InputError):
        yamlsource.parse_yaml(text, Path("m.yaml"))
    assert time.monotonic() - started < 5
