"""What the multi-arch publishing tests share (test_multiarch, test_vex_signed): a one-row matrix built for both
machines, and a stand-in image for either of its images."""
import io
import uuid

from torchimages.build.builder import local_name
from torchimages.publish.publisher import SPEC_HASH_LABEL

from .publish_fixtures import Workspace

MATRIX = """\
registry: localhost:5000/{namespace}/pytorch
variants:
  - torch: 2.13.0
    cuda: cpu
    python: "3.11"
    os: debian12
    arch: [x86_64, aarch64]
    flavors: [runtime]
    aliases: {{runtime: [latest]}}
"""
RUNTIME, RUNTIME_ARM = "2.13.0-cpu-runtime", "2.13.0-cpu-runtime-arm64"


def build_stand_in(space: Workspace, docker_client, tag: str) -> str:
    """The row's image on its own machine's base; the arm64 one's RUN runs under qemu."""
    spec = space.specs[tag]
    dockerfile = f"FROM {spec.base_image}\nRUN echo {uuid.uuid4().hex} > /nonce && uname -m > /machine\n"
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=local_name(spec), rm=True,
                                          labels={SPEC_HASH_LABEL: spec.spec_hash(), "io.torchimages.torch": spec.torch})
    space.verified(tag, image.id)
    return image.id
