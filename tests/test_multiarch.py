"""One tag for both machines: publish pushes each architecture's image and an OCI image index (manifest list) over
their digests, on the engine's real registry, and the catalog and images/README.md list both per-arch digests.

The images are small stand-ins (as in test_publish.py): the amd64 one FROM debian:bookworm, the arm64 one FROM the
engine's arm64v8/debian:bookworm with a RUN step under qemu (devtools/localengine registers it on x86_64 hosts)."""
import dataclasses
import io
import json
import os
import subprocess
import uuid

import pytest

from torchimages import multiarch
from torchimages.builder import local_name
from torchimages.catalog import ManifestList, load_catalog
from torchimages.matrix import load_matrix
from torchimages.model import InputError
from torchimages.publish import SPEC_HASH_LABEL
from torchimages.signatures import signature_tag

from .conftest import FIXTURE_PROJECT
from .signing_fixtures import FIRST, KEYS, TEST_PASSWORD, cosign_accepts, key
from .test_publish import Workspace, clean_up

GRACE = {spec.tag: spec for spec in load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs}
X86, ARM = "2.15.0-cuda13.2-cudnn9-runtime", "2.15.0-cuda13.2-cudnn9-runtime-arm64"


def test_a_multi_arch_row_is_one_index_tag_over_per_arch_tags():
    groups = multiarch.groups(list(GRACE.values()))
    assert set(groups) == {"2.15.0-cuda13.2-cudnn9-runtime", "2.15.0-cuda13.2-cudnn9-devel",
                           "2.14.1-cuda13.0-cudnn9-runtime", "2.14.1-cuda13.0-cudnn9-devel"}
    assert [spec.tag for spec in groups[X86]] == [X86, ARM]
    assert multiarch.image_tags(GRACE[X86], in_group=True) == [f"{X86}-amd64"], "latest goes to the index"
    assert multiarch.image_tags(GRACE[ARM], in_group=True) == [ARM, "latest-arm64"]
    assert multiarch.image_tags(GRACE[X86], in_group=False) == [X86, "latest"], "published alone: as before"
    assert multiarch.index_tags(groups[X86]) == [X86, "latest"]
    assert multiarch.groups([GRACE[X86]]) == {}, "one machine's image alone is no manifest list"


def test_the_index_names_each_digest_with_its_platform_deterministically():
    members = [multiarch.Member("linux/amd64", f"{X86}-amd64", "sha256:" + "a" * 64, "application/x", 10),
               multiarch.Member("linux/arm64", ARM, "sha256:" + "b" * 64, "application/x", 20)]
    body = multiarch.index_body(members)
    assert body == multiarch.index_body(members)
    assert json.loads(body)["mediaType"] == multiarch.INDEX_MEDIA_TYPE
    assert multiarch.platforms_of(body) == {"linux/amd64": "sha256:" + "a" * 64, "linux/arm64": "sha256:" + "b" * 64}
    assert multiarch.platforms_of(b"not json") == {} and multiarch.platforms_of(b"[]") == {}


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


@pytest.fixture
def grace_workspace(tmp_path, engine_env, docker_client):
    space = Workspace(tmp_path, engine_env.registry)
    space.matrix.write_text(MATRIX.format(namespace=space.namespace))
    space.specs = {spec.tag: spec for spec in load_matrix(space.matrix).specs}
    yield space
    clean_up(docker_client, space)


def build_stand_in(space: Workspace, docker_client, tag: str) -> str:
    """The row's image on its own machine's base; the arm64 one's RUN runs under qemu."""
    spec = space.specs[tag]
    dockerfile = f"FROM {spec.base_image}\nRUN echo {uuid.uuid4().hex} > /nonce && uname -m > /machine\n"
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=local_name(spec), rm=True,
                                          labels={SPEC_HASH_LABEL: spec.spec_hash(), "io.torchimages.torch": spec.torch})
    space.verified(tag, image.id)
    return image.id


def raw_manifest(reference: str) -> dict:
    return json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{reference}"],
                                     check=True, capture_output=True, timeout=60).stdout)


@pytest.mark.engine
def test_publish_pushes_both_architectures_and_one_manifest_list_that_each_machine_pulls(grace_workspace,
                                                                                        docker_client):
    space = grace_workspace
    ids = {tag: build_stand_in(space, docker_client, tag) for tag in (RUNTIME, RUNTIME_ARM)}
    assert docker_client.images.get(ids[RUNTIME_ARM]).attrs["Architecture"] == "arm64"
    machine = docker_client.containers.run(ids[RUNTIME_ARM], ["cat", "/machine"], remove=True).decode().strip()
    assert machine == "aarch64", "the arm64 stand-in ran its RUN step under emulation"

    result = space.publish()
    assert "(manifest list: linux/amd64, linux/arm64)" in result.stderr and "3 published" in result.stdout
    catalog = space.catalog_json()
    index = catalog["manifest_lists"][RUNTIME]
    assert index["floating"] == [RUNTIME, "latest"]
    per_arch = {platform: member["digest"] for platform, member in index["platforms"].items()}
    assert per_arch == {"linux/amd64": catalog["images"][RUNTIME]["digest"],
                        "linux/arm64": catalog["images"][RUNTIME_ARM]["digest"]}
    assert catalog["images"][RUNTIME]["floating"] == [f"{RUNTIME}-amd64"]
    assert catalog["images"][RUNTIME_ARM]["floating"] == [RUNTIME_ARM, "latest-arm64"]
    assert catalog["images"][RUNTIME_ARM]["platform"].startswith("linux/arm64")

    # What a user's `skopeo inspect --raw` shows: one index naming both digests with their platforms.
    raw = raw_manifest(f"{space.repository}:{RUNTIME}")
    assert raw["mediaType"] == multiarch.INDEX_MEDIA_TYPE
    assert {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in raw["manifests"]} == per_arch
    assert raw_manifest(f"{space.repository}:latest") == raw

    page = (space.images / "README.md").read_text()
    assert "## Multi-arch tags" in page and index["digest"] in page
    assert all(digest in page for digest in per_arch.values())

    # `docker pull TAG` on each machine gets its own image: this amd64 engine by default, an arm64 one as --platform.
    for platform, image_id in (("linux/amd64", ids[RUNTIME]), ("linux/arm64", ids[RUNTIME_ARM])):
        reference = f"{space.repository}:{RUNTIME}"
        docker_client.api.remove_image(reference, force=True) if docker_client.images.list(reference) else None
        pulled = docker_client.images.pull(space.repository, tag=RUNTIME, platform=platform)
        assert pulled.id == image_id, f"{platform}: {pulled.id} is not the image published for it"

    again = space.publish()
    assert "3 unchanged" in again.stdout, again.stdout
    assert space.catalog_json()["manifest_lists"] == catalog["manifest_lists"]
    space.cli("catalog", "--check-registry", "--catalog", str(space.catalog), check_exit=0)


@pytest.mark.engine
def test_a_signed_publish_signs_the_index_so_cosign_accepts_the_multi_arch_tag(grace_workspace, docker_client, cosign):
    """`cosign verify REPO:TAG` and admission controllers resolve a multi-arch tag to its index digest and look for
    that digest's signature, not the per-arch ones'."""
    space = grace_workspace
    for tag in (RUNTIME, RUNTIME_ARM):
        build_stand_in(space, docker_client, tag)
    signed = {**os.environ, "COSIGN_PASSWORD": TEST_PASSWORD}
    result = space.publish(extra=["--signing-key", str(FIRST)], env=signed)
    assert "3 published" in result.stdout, result.stdout
    catalog = space.catalog_json()
    index = catalog["manifest_lists"][RUNTIME]
    public = KEYS / "first.pub"
    assert cosign_accepts(cosign, f"{space.repository}@{index['digest']}", public)
    assert cosign_accepts(cosign, f"{space.repository}:{RUNTIME}", public)
    assert cosign_accepts(cosign, f"{space.repository}:latest", public)
    assert not cosign_accepts(cosign, f"{space.repository}@{index['digest']}", KEYS / "second.pub")
    assert index["signing"] == {"keys": [key().public.fingerprint], "signature": signature_tag(index["digest"])}

    # A republish by the same key writes nothing: the signature tag and the catalog stay as they are.
    signature_digest = space.digest_of(signature_tag(index["digest"]))
    again = space.publish(extra=["--signing-key", str(FIRST)], env=signed)
    assert "3 unchanged" in again.stdout and again.stdout.count("signature present") == 3, again.stdout
    assert space.digest_of(signature_tag(index["digest"])) == signature_digest
    assert space.catalog_json() == catalog


def test_the_catalog_refuses_a_damaged_manifest_list_naming_it(tmp_path):
    path = tmp_path / "catalog.json"
    index = {"tag": X86, "repository": "localhost:5000/ml/pytorch", "digest": "sha256:" + "a" * 64,
             "floating": [X86], "platforms": {"linux/arm64": {"tag": ARM, "digest": "not a digest", "image": ARM}},
             "updated_at": ""}
    path.write_text(json.dumps({"schema": 1, "updated_at": "", "images": {}, "manifest_lists": {X86: index}}))
    with pytest.raises(InputError) as raised:
        load_catalog(path)
    assert "manifest_lists" in str(raised.value) and "platforms" in str(raised.value)
    good = dataclasses.replace(ManifestList(**index), platforms={"linux/arm64": {"tag": ARM, "digest": "sha256:" + "b" * 64,
                                                                                 "image": ARM}})
    path.write_text(json.dumps({"schema": 1, "updated_at": "", "images": {},
                                "manifest_lists": {X86: dataclasses.asdict(good)}}))
    assert load_catalog(path).manifest_lists[X86] == good


def test_the_catalog_refuses_a_manifest_list_signing_record_that_names_no_signature_tag(tmp_path):
    path = tmp_path / "catalog.json"
    index = {"tag": X86, "repository": "localhost:5000/ml/pytorch", "digest": "sha256:" + "a" * 64, "floating": [X86],
             "platforms": {"linux/arm64": {"tag": ARM, "digest": "sha256:" + "b" * 64, "image": ARM}}, "updated_at": "",
             "signing": {"keys": ["sha256:" + "c" * 64], "signature": "latest"}}
    path.write_text(json.dumps({"schema": 1, "updated_at": "", "images": {}, "manifest_lists": {X86: index}}))
    with pytest.raises(InputError) as raised:
        load_catalog(path)
    assert "signing" in str(raised.value) and "sha256-<hex>.sig" in str(raised.value)
    index["signing"]["signature"] = signature_tag(index["digest"])
    path.write_text(json.dumps({"schema": 1, "updated_at": "", "images": {}, "manifest_lists": {X86: index}}))
    assert load_catalog(path).manifest_lists[X86].signing == index["signing"]
