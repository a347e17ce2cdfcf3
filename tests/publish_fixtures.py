"""What the publishing tests share (test_publish and the signing, trust, VEX, multi-arch and login tests that publish
too): a workspace of a test's own on the engine's registry, with its matrix, folders and stand-in images, and its
clean-up."""
import io
import json
import subprocess
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import docker.errors

from torchimages.build.builder import local_name
from torchimages.matrix.load import load_matrix
from torchimages.publish.publisher import SPEC_HASH_LABEL
from torchimages.verify.reports import CheckVerdict, VerifyReport, verify_report_path

from .conftest import CPU_SELECTOR, ROOT, run_cli, with_live_compat
from .security_fixtures import write_archive

RUNTIME, DEVEL = "2.13.0-cpu-runtime", "2.13.0-cpu-devel"
MATRIX = """\
registry: localhost:5000/{namespace}/pytorch
variants:
  - torch: 2.13.0
    cuda: cpu
    python: "3.11"
    os: debian12
    flavors: [runtime, devel]
    aliases: {{runtime: [latest]}}
"""


MANIFEST_TYPES = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"


class Workspace:
    """A matrix of its own (so local image names and registry repositories are this test's alone) and its folders."""

    def __init__(self, root: Path, registry_host: str, real_rows: bool = False):
        self.namespace = f"t{uuid.uuid4().hex[:10]}"
        self.root = root
        self.matrix = root / "matrix.yaml"
        # real_rows: the project's own matrix (the CPU rows exactly as CI builds them) under this test's registry name.
        text = ((ROOT / "matrix.yaml").read_text().replace("registry: localhost:5000/ml/pytorch",
                                                          f"registry: localhost:5000/{self.namespace}/pytorch")
                if real_rows else MATRIX.format(namespace=self.namespace))
        with_live_compat(self.matrix)
        self.matrix.write_text(text)
        # The publish gate reads debian12's security index from a folder of this test's own (no network): an archive
        # with no fixes unless a test writes one (security_fixtures.write_archive), signed with this keyring if there.
        self.security_archive, self.security_keyring = root / "security-archive", root / "security-archive.gpg"
        write_archive(self.security_archive, None, [])
        compat = self.matrix.with_name("compat.yaml")
        live = compat.read_text()
        assert 'url: "http://deb.debian.org/debian-security"' in live
        compat.write_text(live.replace('url: "http://deb.debian.org/debian-security"', f'url: "{self.security_archive}"')
                          .replace("keyring: /usr/share/keyrings/debian-archive-keyring.gpg",
                                   f'keyring: "{self.security_keyring}"'))
        self.specs = {spec.tag: spec for spec in load_matrix(self.matrix).specs}
        self.images, self.reports, self.catalog = root / "images", root / "reports", root / "catalog"
        self.registry_host = registry_host
        self.repository = f"{registry_host}/{self.namespace}/pytorch"

    def cli(self, *args: str, check_exit: int | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        return run_cli("--matrix", str(self.matrix), "--images", str(self.images), "--reports", str(self.reports),
                       *args, check_exit=check_exit, env=env)

    def publish(self, *selectors: str, date: str = "20260101", check_exit: int | None = 0, extra=(), env=None):
        # Through cli(): a workspace with a login (test_registry_login) adds its Docker config there.
        return self.cli("publish", *selectors, "--registry", self.repository, "--catalog", str(self.catalog),
                        "--date", date, *extra, check_exit=check_exit, env=env)

    def build(self, docker_client, tag: str, blob_mb: int = 0) -> str:
        """A stand-in for the row's image: unique content, the labels publish checks. Returns its image id."""
        spec = self.specs[tag]
        steps = f"echo {uuid.uuid4().hex} > /nonce" + (f" && head -c {blob_mb}M /dev/urandom > /blob" if blob_mb else "")
        dockerfile = f"FROM debian:bookworm\nRUN {steps}\n"
        image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=local_name(spec), rm=True,
                                              labels={SPEC_HASH_LABEL: spec.spec_hash(), "io.torchimages.torch": spec.torch})
        return image.id

    def verified(self, tag: str, image_id: str, passed: bool = True) -> None:
        """What `build.py test` writes (reports/<tag>/verify.json), as publish's input."""
        checks = {"identity": CheckVerdict("passed", "torch 2.13.0+cpu"),
                  "gpu": CheckVerdict("skipped", "CPU image: no GPU checks apply"),
                  "hygiene": CheckVerdict("passed" if passed else "failed", "no secrets")}
        report = VerifyReport(image_id, passed, checks, tag=tag, image=local_name(self.specs[tag]),
                              finished_at="2026-01-01T00:00:00Z")
        path = verify_report_path(self.reports, tag)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.to_json()))

    def build_verified(self, docker_client, tag: str, blob_mb: int = 0) -> str:
        image_id = self.build(docker_client, tag, blob_mb)
        self.verified(tag, image_id)
        return image_id

    def catalog_json(self) -> dict:
        return json.loads((self.catalog / "catalog.json").read_text())

    def digest_of(self, tag: str) -> str | None:
        request = urllib.request.Request(f"http://{self.registry_host}/v2/{self.namespace}/pytorch/manifests/{tag}",
                                         method="HEAD", headers={"Accept": MANIFEST_TYPES})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.headers["Docker-Content-Digest"]
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def manifest(self, tag: str) -> dict:
        request = urllib.request.Request(f"http://{self.registry_host}/v2/{self.namespace}/pytorch/manifests/{tag}",
                                         headers={"Accept": MANIFEST_TYPES})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def tags(self) -> list[str]:
        try:
            with urllib.request.urlopen(f"http://{self.registry_host}/v2/{self.namespace}/pytorch/tags/list", timeout=10) as response:
                return sorted(json.loads(response.read())["tags"] or [])
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return []
            raise


def clean_up(docker_client, space: Workspace) -> None:
    """Delete what the test published (manifests; the registry keeps shared layers) and its local tags."""
    for digest in {space.digest_of(tag) for tag in space.tags()} - {None}:
        urllib.request.urlopen(urllib.request.Request(
            f"http://{space.registry_host}/v2/{space.namespace}/pytorch/manifests/{digest}", method="DELETE"), timeout=10).close()
    for spec in space.specs.values():
        for name in (local_name(spec), f"{space.repository}:{spec.tag}"):
            try:
                docker_client.api.remove_image(name, force=True)
            except docker.errors.ImageNotFound:
                pass


def nightly(space: Workspace, wheelhouse, *extra: str, env=None) -> tuple[subprocess.CompletedProcess, dict]:
    result = space.cli("nightly", CPU_SELECTOR, "--registry", space.repository, "--catalog", str(space.catalog),
                       "--wheelhouse", str(wheelhouse), *extra, env=env)
    return result, json.loads((space.reports / "nightly-summary.json").read_text())
