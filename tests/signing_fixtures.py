"""What the signing tests share: the test keys and the real cosign CLI.

data/signing/{first,second}.key are key pairs made by `cosign generate-key-pair` 2.5 with the password TEST_PASSWORD:
test keys, never used for anything published.
"""
import subprocess
from pathlib import Path

from torchimages.trust import attestations, signing

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

