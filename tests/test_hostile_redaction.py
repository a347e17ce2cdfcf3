"""Logins on the command line are never printed (issue 45's fifth hostile-input round; docs/hostile-input.md, "The new
code"): in an image reference, and in a value quoted cut short."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("reference", ["ci:s3cret-ref-pass@registry.example.com/ml/pytorch:2.13",
                                       "https://ci:s3cret-ref-pass@registry.example.com/ml/pytorch:2.13",
                                       "ci:s3cret-ref-pass" + "W" * 80 + "@registry.example.com/ml/pytorch"])
def test_a_login_in_an_image_reference_is_never_printed(tmp_path, reference):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from .conftest import FIXTURE_PROJECT, run_cli_in_process
    key = tmp_path / "cosign.pub"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    shown = run_cli_in_process("--project", str(FIXTURE_PROJECT), "verify-image", reference, "--key", str(key))
    assert shown.returncode == 2, shown.stderr
    assert "s3cret" not in shown.stdout + shown.stderr, shown.stderr


def test_a_secret_quoted_cut_short_is_redacted_too():
    from torchimages.files import brief
    from torchimages.redaction import Secrets
    password = "s3cret-" + "p" * 80
    secrets = Secrets.in_arguments([f"ci:{password}@host/repo"])
    shown = secrets.redact(f"REF {brief('ci:' + password + '@host/repo')} is not a reference")
    assert "s3cret" not in shown and shown.startswith("REF '<redacted>... (")
