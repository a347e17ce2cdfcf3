"""A login written into an image reference (user:password@host/repo:tag, perhaps after https://) is refused before
any engine or registry is called, with exit 2 and one line that shows the reference without it and says to use
`docker login HOST`; it is never printed, whatever else is wrong with the reference (docs/hostile-input.md)."""
from __future__ import annotations

import socket

import pytest

from torchimages.model import InputError

from .conftest import FIXTURE_PROJECT
from .hostile_fixtures import CPU_RUNTIME, run_bounded

# Every password starts with MARKER, so that no piece of one (cut at a '/' or an '@' a parser split at) is printed
# either; between them they hold each character that ends a part of a URL or a reference: '/', '@', ':', '+', '=', '%'.
MARKER = "s3cr"
PASSWORDS = [f"{MARKER}/et+pa=ss", f"{MARKER}@et:pa%2Fss", f"{MARKER}//@@x"]
DIGEST = "sha256:" + "a" * 64
# Where the parse would fail were the login not refused first: {password} stands for each of PASSWORDS.
REFERENCES = {
    "valid otherwise": "ci:{password}@registry.example.com/ml/pytorch:2.13",
    "a URL with a digest": "https://ci:{password}@registry.example.com/ml/pytorch@" + DIGEST,
    "bad port": "ci:{password}@registry.example.com:99999/ml/pytorch:2.13",
    "empty repository": "ci:{password}@registry.example.com/",
    "two @": "ci:{password}@@registry.example.com/ml/pytorch:2.13",
    "upper-case repository": "ci:{password}@registry.example.com/ML/PyTorch:2.13",
    "short digest": "ci:{password}@registry.example.com/ml/pytorch@sha256:abc",
    "no repository after the host": "ci:{password}@localhost:5000",
    "a token without a user": "{password}@registry.example.com/ml/pytorch:2.13",
}
# Each command that takes a reference, with whatever else it needs to get as far as reading it.
COMMANDS = {
    "verify-image": lambda reference: ("verify-image", reference, "--key", "cosign.pub"),
    "rebuild": lambda reference: ("rebuild", reference, "--key", "cosign.pub"),
    "rebuild --check": lambda reference: ("rebuild", "--check", reference, "--key", "cosign.pub"),
    "test --image": lambda reference: ("test", CPU_RUNTIME, "--image", reference),
    "gpu-record --image": lambda reference: ("gpu-record", CPU_RUNTIME, "--image", reference),
    "security --image": lambda reference: ("security", "--image", reference),
    "publish --registry": lambda reference: ("publish", "--registry", reference),
}


@pytest.fixture
def no_network(monkeypatch):
    """Any connection a command tries fails the test: the refusal must come before an engine or registry is asked."""
    attempts = []

    def refuse(sock, address):
        attempts.append(address)
        raise ConnectionRefusedError(f"test: no connection allowed ({address})")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


def assert_never_shown(text: str, password: str) -> None:
    assert MARKER not in text, text
    assert password not in text and f"ci:{password}" not in text, text


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("reference", REFERENCES.values(), ids=REFERENCES.keys())
@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_login_in_a_reference_is_refused_unshown_before_any_connection(tmp_path, no_network, command, reference,
                                                                        password, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --key cosign.pub names no file: the reference must be refused before it is read
    result = run_bounded("--project", str(FIXTURE_PROJECT), "--reports", str(tmp_path / "reports"),
                         *command(reference.format(password=password)))
    assert_never_shown(result.stdout + result.stderr, password)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "holds a login" in lines[0] and "`docker login " in lines[0], lines[0]
    assert not no_network, f"connected to {no_network} before refusing the reference"


@pytest.mark.parametrize(("reference", "shown", "host"), [
    ("ci:pa/ss@registry.example.com/ml/pytorch:2.13", "<redacted>@registry.example.com/ml/pytorch:2.13",
     "registry.example.com"),
    ("https://ci:pa@ss@localhost:5000/ml/pytorch@" + DIGEST, "://<redacted>@localhost:5000/ml/pytorch@sha256:",
     "localhost:5000"),
])
def test_the_refusal_shows_the_reference_without_its_login_and_the_host_to_log_in_to(reference, shown, host):
    from torchimages.publish.verify_image import image_reference
    with pytest.raises(InputError) as refused:
        image_reference(reference)
    message = str(refused.value.problems[0])
    assert shown in message and f"`docker login {host}`" in message, message
    assert "pa/ss" not in message and "pa@ss" not in message


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("reference", REFERENCES.values(), ids=REFERENCES.keys())
def test_no_parser_puts_a_login_into_its_exception(reference, password):
    """The exceptions themselves hold no login, not only what the output streams let through."""
    from torchimages.peers.registry_address import parse_image_name, parse_registry
    from torchimages.publish.verify_image import image_reference
    for parse in (image_reference, parse_registry, parse_image_name):
        with pytest.raises(InputError) as refused:
            parse(reference.format(password=password))
        assert_never_shown(repr(refused.value) + "".join(map(str, refused.value.problems)), password)


@pytest.mark.parametrize(("reference", "said"), [
    ("registry.example.com:99999/ml/pytorch:2.13", "port 99999"),
    ("registry.example.com/ML/PyTorch:2.13", "lower case"),
    ("registry.example.com/ml/pytorch@sha256:abc", "64 lower-case hex digits"),
    ("registry.example.com/ml/pytorch:bad@@tag", "holds a login"),
    ("https://registry.example.com/ml/pytorch:2.13", "without a scheme"),
    ("registry.example.com/ml/pytorch:a tag", "a tag is"),
])
def test_a_malformed_reference_without_a_login_gets_one_line_naming_it(tmp_path, reference, said):
    result = run_bounded("--project", str(FIXTURE_PROJECT), "verify-image", reference, "--key", "cosign.pub")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and said in lines[0], result.stderr


@pytest.mark.parametrize("name", ["pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", "ubuntu", "ubuntu@" + DIGEST,
                                  "localhost:5000/ml/pytorch", "my_namespace/repo:1", DIGEST,
                                  "registry.example.com/ml/pytorch:2.13@" + DIGEST])
def test_image_names_docker_takes_are_still_taken(name):
    from torchimages.peers.registry_address import parse_image_name
    assert parse_image_name(name) == name


@pytest.mark.parametrize("reference", ["registry.example.com/ml/pytorch:2.13", "localhost:5000/ml/pytorch@" + DIGEST])
def test_a_reference_without_a_login_still_parses_and_redacts_nothing(reference):
    from torchimages.publish.verify_image import image_reference
    from torchimages.redaction import Secrets
    registry, _ = image_reference(reference)
    assert registry.name in reference
    assert Secrets.in_arguments(["verify-image", reference]).redact(reference) == reference


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_password_holding_a_slash_is_redacted_from_a_peers_text(password):
    """The output streams' last line of defence reads a reference's login as the parsers do, even when a '/' in the
    password puts its end after the first '/'."""
    from torchimages.redaction import Secrets
    reference = f"ci:{password}@registry.example.com/ml/pytorch:2.13"
    secrets = Secrets.in_arguments(["rebuild", reference])
    assert_never_shown(secrets.redact(f"engine: invalid reference format: {reference}"), password)
