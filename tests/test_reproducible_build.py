"""Issue 47 on a real engine: a --no-cache build of the CPU rows from the same wheels and recorded .debs gives the
session build's image ids, and pushed with the pinned compression the same manifest digests; `rebuild` reproduces a signed digest from its provenance
and names the layer and file of one that differs (docs/reproducible.md)."""
import hashlib
import io
import json
import os
import tarfile

import docker.errors
import pytest

from torchimages.build import debs as deb_pins
from torchimages.build.reproducible import (
    ChunkReader,
    engine_config,
    saved_config,
    settled_config,
    stored_config,
)
from torchimages.matrix.load import load_matrix
from torchimages.peers.registry import RegistryClient, RetryPolicy
from torchimages.peers.registry_access import registry_access
from torchimages.peers.registry_address import image_registry
from torchimages.trust import attestations
from torchimages.trust.signatures import SignatureStore

from .build_fixtures import build_input_servers_left, steps_run
from .conftest import CPU_SELECTOR, ROOT, SHARED_STEPS, one_process_at_a_time, run_cli, with_live_compat
from .signing_fixtures import FIRST, KEYS, SECOND, key

pytestmark = pytest.mark.engine
REPOSITORY = "localhost:5000/test/reproducible"
TORCH_FILE = "opt/venv/lib/python3.11/site-packages/torch/version.py"  # from the torch wheel, in the torch layer


def test_a_no_cache_build_from_the_recorded_debs_gives_the_very_images_and_manifest_digests(
        cpu_images, wheelhouse, tmp_path, docker_client, tmp_path_factory, own_registry):
    """Issue 47 (and issue 20's venv layers): the CPU rows built again without the cache, every step run again, the OS
    packages from the .debs the session's build recorded (kept by `debs`, offline), give the very image ids of the
    session's build, and pushed with the pinned compression the very manifest digests. The rows' own names are built
    again, so that the config (its ref.name label) can be the same: a build that reproduces tags the same image.
    Without the cache the devel row still shares every runtime layer below its own (it takes them from its runtime,
    built moments before) while its own steps run again. (One no-cache build for what were two tests' two no-cache
    builds of about 3 minutes each; that the wheels' server on the engine gives the same venv layers is the BuildKit
    test's, in test_build.)"""
    _, host = own_registry
    address, _ = image_registry(f"{host}/test/reproducible:any")
    registry = RegistryClient(address, registry_access(address, config_dir=tmp_path), RetryPolicy(retries=0), print)
    first = {tag: docker_client.api.inspect_image(name)["Id"] for tag, name in cpu_images.items()}
    digests = {tag: registry.push(image_id, f"{tag}-first", os.environ["DOCKER_HOST"], "gzip")
               for tag, image_id in first.items()}
    run_cli("debs", CPU_SELECTOR, "--dest", str(tmp_path / "debs"), check_exit=0)
    with one_process_at_a_time(tmp_path_factory, SHARED_STEPS):  # no cache: it makes every shared step again
        run_cli("--reports", str(tmp_path / "second"), "build", CPU_SELECTOR, "--wheelhouse", str(wheelhouse),
                "--no-cache", "--force", "--debs", str(tmp_path / "debs"), check_exit=0)
    report = json.loads((tmp_path / "second" / "build-report.json").read_text())
    assert {entry["status"] for entry in report["images"]} == {"built"}
    second = {entry["tag"]: entry["image_id"] for entry in report["images"]}
    runtime_log = (tmp_path / "second" / "2.13.0-cpu-runtime" / "build.log").read_text()
    assert "apt-get install" in runtime_log and " ---> Running in " in runtime_log, "the build ran its steps again"
    assert "/debs/python ./ Packages" in runtime_log and "deb.debian.org" not in runtime_log, "apt read the mirror"
    assert any(" useradd " in step for step in steps_run(runtime_log)), "a no-cache build ran the RUN steps again"
    devel_log = (tmp_path / "second" / "2.13.0-cpu-devel" / "build.log").read_text()
    assert any("ninja-build" in step for step in steps_run(devel_log)), "devel's toolchain step ran again, not taken " \
                                                                         "from an earlier build"
    assert build_input_servers_left(docker_client, tmp_path / "second") == ([], [])
    layers = {tag: docker_client.api.inspect_image(image_id)["RootFS"]["Layers"] for tag, image_id in second.items()}
    assert layers["2.13.0-cpu-devel"][:-2] == layers["2.13.0-cpu-runtime"][:-1], \
        "devel shares every runtime layer below its own"
    assert second == first, "the same inputs built again without the cache gave other images"
    recorded = json.loads((tmp_path / "second" / "2.13.0-cpu-runtime" / "debs.json").read_text())["debs"]
    assert {"python", "venv", "system", "security"} <= {pin["step"] for pin in recorded}
    for tag, image_id in second.items():
        assert registry.push(image_id, f"{tag}-second", os.environ["DOCKER_HOST"], "gzip") == digests[tag]
    image = docker_client.api.inspect_image(first["2.13.0-cpu-runtime"])
    assert image["Created"] == image["Config"]["Labels"]["org.opencontainers.image.created"].replace("Z", "") + "Z"


def test_the_config_read_without_a_save_is_the_one_a_save_gives(cpu_images, docker_client):
    """Issue 58: a classic build's config is read from the engine's store, or else its inspect and history (and its
    base's own config), not from a `docker save` of the whole image: settled, it is byte for byte the config the save
    gives, so the images keep their ids and published digests."""
    api = docker_client.api
    for name in cpu_images.values():
        saved = saved_config(api.get_image(name))
        base_history = len(saved_config(api.get_image("debian:bookworm"))["history"])
        read = engine_config(api, name, "debian:bookworm")
        assert read is not None, f"{name}: its history did not add up to its layers"
        assert settled_config(read, saved["created"], base_history) == settled_config(saved, saved["created"],
                                                                                      base_history)
        assert stored_config(api, api.inspect_image(name)["Id"]) == saved, "the engine's store: the very config"


def tampered_copy(docker_client, image: str, name: str, path: str, scratch) -> None:
    """image again as name, with one byte of one file changed in the layer that holds path: the layer, its diff id
    and the config that lists it change, nothing else (docker save, rewritten as it streams, docker load; a layer is
    held in memory while it is read: the torch layer is about a gigabyte).
    The save lists its files by name, so the config and manifest are written last, once every layer was read."""
    renamed: dict[str, str] = {}
    last: list[tuple[tarfile.TarInfo, bytes]] = []
    archive_path = scratch / "tampered.tar"
    with tarfile.open(fileobj=ChunkReader(docker_client.api.get_image(image)), mode="r|") as source, \
            tarfile.open(archive_path, mode="w") as target:
        for member in source:
            content = source.extractfile(member).read() if member.isfile() else None
            if member.name.endswith("/layer.tar") and path.encode() in content:
                changed = tampered_layer(content, path)
                renamed[f"sha256:{hashlib.sha256(content).hexdigest()}"] = f"sha256:{hashlib.sha256(changed).hexdigest()}"
                content = changed
            if member.isfile() and member.name.endswith(".json") and "/" not in member.name:
                last.append((member, content))
                continue
            if content is not None:
                member.size = len(content)
            target.addfile(member, io.BytesIO(content) if content is not None else None)
        for member, content in last:
            if member.name == "manifest.json":
                content = json.dumps([{**json.loads(content)[0], "RepoTags": [name]}]).encode()
            else:
                config = json.loads(content)
                config["rootfs"]["diff_ids"] = [renamed.get(d, d) for d in config["rootfs"]["diff_ids"]]
                content = json.dumps(config).encode()
            member.size = len(content)
            target.addfile(member, io.BytesIO(content))
    assert renamed, f"no layer of {image} holds {path}"
    with open(archive_path, "rb") as archive:
        docker_client.api.load_image(archive)


def tampered_layer(layer: bytes, path: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(layer)) as source, tarfile.open(fileobj=out, mode="w") as target:
        for member in source.getmembers():
            content = source.extractfile(member).read() if member.isfile() else None
            if member.name == path:
                content = content[:-1] + bytes([content[-1] ^ 1])
            target.addfile(member, io.BytesIO(content) if content is not None else None)
    return out.getvalue()


def test_rebuild_reproduces_a_signed_digest_offline_and_names_the_layer_and_file_that_differ(
        cpu_images, wheelhouse, tmp_path, docker_client, own_registry):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", REPOSITORY))
    with_live_compat(matrix)
    _, host = own_registry
    address, _ = image_registry(f"{host}/test/reproducible:any")
    registry = RegistryClient(address, registry_access(address, config_dir=tmp_path), RetryPolicy(retries=0), print)
    store, tag = SignatureStore(registry), "2.13.0-cpu-runtime"
    cli = lambda *args, **kwargs: run_cli("--matrix", str(matrix), "--reports", str(tmp_path / "reports"),  # noqa: E731
                                          *args, **kwargs)
    local, tampered = f"{REPOSITORY}:{tag}", f"{REPOSITORY}:{tag}-tampered"
    try:
        cli("build", tag, "--wheelhouse", str(wheelhouse), check_exit=0)
        cli("debs", tag, "--dest", str(tmp_path / "debs"), check_exit=0)  # the project's debs/: rebuild's default
        spec = next(spec for spec in load_matrix(matrix).specs if spec.tag == tag)
        wheels = json.loads((tmp_path / "reports" / tag / "wheels.json").read_text())["wheels"]

        def published(image: str, pinned: str, commit: str | None = None, signer=FIRST) -> str:
            digest = registry.push(docker_client.api.inspect_image(image)["Id"], pinned, os.environ["DOCKER_HOST"],
                                   "gzip")
            provenance = attestations.provenance_predicate(spec, docker_client.api.inspect_image(image), wheels, None,
                                                           deb_pins.image_pins(docker_client.api, image))
            if commit:
                provenance["buildDefinition"]["resolvedDependencies"][0]["digest"]["gitCommit"] = commit
            store.sign(key(signer), digest)
            store.attest(key(signer), digest, {attestations.PROVENANCE_PREDICATE: provenance})
            return f"{host}/test/reproducible@{digest}"

        reference = published(local, tag)
        done = cli("rebuild", reference, "--key", str(KEYS / "first.pub"), "--wheelhouse", str(wheelhouse), check_exit=0)
        assert f"reproduced {reference.split('@')[1]}" in done.stdout
        # Bad provenance: another key's, a wheel that is not there, a commit the checkout lacks: one line, exit 2.
        other = cli("rebuild", reference, "--key", str(KEYS / "second.pub"), check_exit=2)
        assert "no signature by this key" in other.stderr and len(other.stderr.strip().splitlines()) == 1
        (tmp_path / "empty").mkdir()
        missing = cli("rebuild", reference, "--key", str(KEYS / "first.pub"), "--wheelhouse", str(tmp_path / "empty"),
                      check_exit=2)
        assert f"error: {reference}: wheel " in missing.stderr and "build.py wheels" in missing.stderr
        no_debs = cli("rebuild", reference, "--key", str(KEYS / "first.pub"), "--debs", str(tmp_path / "empty"),
                      check_exit=2)
        assert f"`python build.py debs {tag} --dest" in no_debs.stderr and len(no_debs.stderr.strip().splitlines()) == 1
        published(local, tag, commit="0" * 40, signer=SECOND)
        lacking = cli("rebuild", reference, "--key", str(KEYS / "second.pub"), check_exit=2)
        assert f"commit {'0' * 40} is not in the checkout" in lacking.stderr and "Traceback" not in lacking.stderr
        # A published image whose torch layer differs by one byte of one of torch's files from what its claimed
        # wheels give: that layer and that file are named.
        tampered_copy(docker_client, local, tampered, TORCH_FILE, tmp_path)
        tampered_reference = published(tampered, "tampered")
        differs = cli("rebuild", tampered_reference, "--key", str(KEYS / "first.pub"), "--check",
                      "--wheelhouse", str(wheelhouse), check_exit=1)
        assert "an earlier rebuild made from the same provenance: not built again" in differs.stdout, \
            "the tampered copy claims the first one's provenance: compared with that rebuild, no second one"
        layers = docker_client.api.inspect_image(local)["RootFS"]["Layers"]
        index = next(i for i, d in enumerate(docker_client.api.inspect_image(tampered)["RootFS"]["Layers"])
                     if d != layers[i])
        assert f"differs: layer {index + 1} of {len(layers)}: ours {layers[index]}" in differs.stdout
        steps = [entry.get("created_by", "") for entry in
                 registry.image_config(tampered_reference.split("@")[1])["history"] if not entry.get("empty_layer")]
        assert "WHEELS_TORCH" in steps[index] and "WHEELS_REST" not in steps[index], "the torch layer is named"
        assert f"first differing file: ours {TORCH_FILE}: size" in differs.stdout
        assert f"theirs {TORCH_FILE}" in differs.stdout
    finally:
        for image in (local, tampered, f"{REPOSITORY}-rebuilt:{tag}"):
            try:
                docker_client.images.remove(image, force=True)
            except docker.errors.ImageNotFound:
                pass
