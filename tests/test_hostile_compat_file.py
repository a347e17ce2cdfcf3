"""compat refresh reads compat.yaml with ruamel (round trip): a syntax error, a duplicate key or a release block of
the wrong shape is `file:line: ...`, exit 2, never ruamel's raw error or a traceback (issue 45, earlier rounds'
leftovers)."""
import pytest

from .conftest import ROOT, run_cli_in_process

LIVE = (ROOT / "compat.yaml").read_text()


@pytest.mark.parametrize(("text", "line", "says"), [
    ("torch: [\n", 2, "expected the node content"),
    ("torch:\n  a: 1\n  a: 2\n", 3, "found duplicate key"),
    (LIVE.replace('python: {min: "3.11", max: "3.15"}', 'python: "3.11"', 1), 29, "python: is '3.11', not a mapping"),
    (LIVE.replace('python: {min: "3.11", max: "3.15"}', 'python: [3.11]', 1), 29, "not a mapping"),
    ("torch:\n  2.14.1: 7\n", 2, "release '2.14.1' is not a mapping of its facts"),
    ("torch:\n  2.14.1:\n    cuda: {\"13.0\": yes}\n", 3, "cuda '13.0' is not a mapping of its facts"),
])
def test_a_damaged_compat_file_is_one_line_naming_its_line(tmp_path, text, line, says):
    compat = tmp_path / "compat.yaml"
    compat.write_text(text)
    (tmp_path / "matrix.yaml").write_text((ROOT / "matrix.yaml").read_text())
    result = run_cli_in_process("--compat", str(compat), "compat", "refresh", "--check", "--index-url",
                                "http://127.0.0.1:9/simple")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    [message] = result.stderr.strip().splitlines()
    assert message.startswith(f"error: {compat}:{line}: ") and says in message, message
