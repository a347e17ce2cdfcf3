"""compat refresh reads compat.yaml with ruamel (round trip): a syntax error, a duplicate key or a release block of
the wrong shape is `file:line: ...`, exit 2, never ruamel's raw error or a traceback (issue 45, earlier rounds'
leftovers). The damaged files are the fixture project's compat.yaml (tests/project/), never the live one: a release
added to the repository's data moves no line here."""
import shutil

import pytest

from .conftest import FIXTURE_COMPAT, FIXTURE_MATRIX, run_cli_in_process

FIXTURE = FIXTURE_COMPAT.read_text()
# The first release's Python range: the damage below is done there, and the error names its line.
PYTHON_RANGE = 'python: {min: "3.11", max: "3.15"}'


def line_of(text: str, fragment: str) -> int:
    """The 1-based line of text where fragment first appears."""
    return text[:text.index(fragment)].count("\n") + 1


@pytest.mark.parametrize(("text", "line", "says"), [
    ("torch: [\n", 2, "expected the node content"),
    ("torch:\n  a: 1\n  a: 2\n", 3, "found duplicate key"),
    (FIXTURE.replace(PYTHON_RANGE, 'python: "3.11"', 1), line_of(FIXTURE, PYTHON_RANGE),
     "python: is '3.11', not a mapping"),
    (FIXTURE.replace(PYTHON_RANGE, 'python: [3.11]', 1), line_of(FIXTURE, PYTHON_RANGE), "not a mapping"),
    ("torch:\n  2.14.1: 7\n", 2, "release '2.14.1' is not a mapping of its facts"),
    ("torch:\n  2.14.1:\n    cuda: {\"13.0\": yes}\n", 3, "cuda '13.0' is not a mapping of its facts"),
])
def test_a_damaged_compat_file_is_one_line_naming_its_line(tmp_path, text, line, says):
    compat = tmp_path / "compat.yaml"
    compat.write_text(text)
    shutil.copy(FIXTURE_MATRIX, tmp_path / "matrix.yaml")
    # --project: the run's project is this scratch folder, not the checkout the tests run in.
    result = run_cli_in_process("--project", str(tmp_path), "--compat", str(compat), "compat", "refresh", "--check",
                                "--index-url", "http://127.0.0.1:9/simple")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    [message] = result.stderr.strip().splitlines()
    assert message.startswith(f"error: {compat}:{line}: ") and says in message, message
