"""What the signing tests share (test_signing, test_keys, test_trust, test_admission, test_policies, test_multiarch,
test_vex_signed): the test keys and the real cosign CLI, a refused signed publish, a verification report, and a
workspace's signature store.

data/signing/{first,second}.key are key pairs made by `cosign generate-key-pair` 2.5 with the password TEST_PASSWORD:
test keys, never used for anything published.
"""
import os
import subprocess
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from torchimages.peers.registry import RegistryClient, RetryPolicy
from torchimages.peers.registry_access import registry_access
from torchimages.peers.registry_address import Registry
from torchimages.trust import attestations, signing
from torchimages.trust.signatures import Layer, SignatureStore, artifact_files
from torchimages.verify.reports import CheckVerdict, VerifyReport, judged_host

from .conftest import FIXTURE_PROJECT, run_cli_in_process
from .publish_fixtures import Workspace

KEYS = Path(__file__).parent / "data" / "signing"
TEST_PASSWORD = "torchimages-test"
FIRST, SECOND = KEYS / "first.key", KEYS / "second.key"


def key(path: Path = FIRST) -> signing.SigningKey:
    return signing.load_signing_key(str(path), {signing.PASSWORD_VARIABLE: TEST_PASSWORD})


def run_cosign(cosign: Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(cosign), *arguments, "--insecure-ignore-tlog=true", "--allow-insecure-registry",
                           "--allow-http-registry"], capture_output=True, text=True, timeout=120, check=False)


def cosign_accepts(cosign: Path, reference: str, public: Path, predicate_type: str | None = None) -> bool:
    """Whether `cosign verify` (or `verify-attestation --type` for predicate_type) accepts reference with public."""
    if predicate_type is None:
        return run_cosign(cosign, "verify", "--key", str(public), reference).returncode == 0
    kind = attestations.COSIGN_TYPE_NAMES[predicate_type]
    return run_cosign(cosign, "verify-attestation", "--key", str(public), "--type", kind, reference).returncode == 0


def accepted_everything(cosign: Path, reference: str, public: Path) -> bool:
    return cosign_accepts(cosign, reference, public) and all(
        cosign_accepts(cosign, reference, public, kind) for kind in attestations.PREDICATE_TYPES)


DIGEST = "sha256:" + "ab" * 32
# A frozen matrix of the tests' own (a new row in matrix.yaml changes no test here).
MATRIX = FIXTURE_PROJECT / "golden-matrix.yaml"
CPU_ROW = "2.13.0-cpu-devel"


def pem_key(private, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def scratch_folders(folder: Path) -> list[str]:
    """Where a publish that is refused up front would have written: this test's own folders."""
    return ["--reports", str(folder / "reports"), "--images", str(folder / "images")]


def publish_refusing_the_key(folder: Path, source: str, environment: dict, expected: str):
    """A signed publish given a key it cannot use: exit 2 and one line saying expected, before anything is pushed.
    Returns the run and its line."""
    result = run_cli_in_process("--matrix", str(MATRIX), *scratch_folders(folder), "publish", CPU_ROW, "--registry",
                                "127.0.0.1:1/x/pytorch", "--catalog", str(folder / "catalog"), "--signing-key",
                                source, env=environment)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.stderr, result.stderr
    return result, lines[0]


def verification_report(gpu: bool) -> VerifyReport:
    """A verification as `build.py test` records it: on a CPU-only host, or on an H100 host with driver 580.95.05
    (the shape of tests/gpu_hosts' H100 record: nvidia-smi's driver_version, torch's device name and capability),
    the host judged from those facts as the verify stage judges it."""
    checks = {"identity": CheckVerdict("passed", "torch 2.14.1+cu130"),
              "gpu": CheckVerdict("passed", "1 GPU") if gpu else CheckVerdict("skipped", "no GPU on this host")}
    gpu_facts = {"driver_version": "580.95.05", "libcuda_driver_version": 13000,
                 "devices": [{"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]}]}
    host = judged_host({name: {"status": check.status} for name, check in checks.items()}, gpu_facts if gpu else {})
    return VerifyReport("sha256:" + "12" * 32, True, checks, tag="t", finished_at="2026-11-25T00:00:00Z", host=host)


SIGNED = {"COSIGN_PASSWORD": TEST_PASSWORD}


def store_of(space: Workspace) -> SignatureStore:
    registry = Registry(space.registry_host, f"{space.namespace}/pytorch")
    return SignatureStore(RegistryClient(registry, registry_access(registry), RetryPolicy(retries=1), lambda _: None))


def environment(**extra) -> dict:
    return {**os.environ, **extra}


def write_layers(store: SignatureStore, tag: str, layers: list[Layer]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "artifact"
        folder.mkdir()
        for name, content in artifact_files(layers).items():
            (folder / name).write_bytes(content)
        store.registry.write_artifact(folder, tag)
