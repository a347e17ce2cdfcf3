"""One tag for both machines: publish pushes each architecture's image and an OCI image index (manifest list) over
their digests, on the engine's real registry, and the catalog and images/README.md list both per-arch digests.

The images are small stand-ins (as in test_publish.py): the amd64 one FROM debian:bookworm, the arm64 one FROM the
engine's arm64v8/debian:bookworm with a RUN step under qemu (devtools/localengine registers it on x86_64 hosts)."""
import dataclasses
import json
import os
import subprocess

import pytest

from torchimages.matrix.load import load_matrix
from torchimages.model import InputError
from torchimages.peers.registry import Manifest
from torchimages.publish import multiarch
from torchimages.publish.catalog import (
    Catalog,
    ManifestList,
    PinnedIndex,
    forget_pinned,
    load_catalog,
    matches_spec,
    versions,
)
from torchimages.publish.catalog_page import readme
from torchimages.publish.prune import index_members, pinned_stems, prune_plan
from torchimages.publish.publisher import DATED_TAG, dated_tags, new_pinned_tag
from torchimages.trust import attestations, bundles
from torchimages.trust.signatures import attestation_tag, gather_evidence, signature_tag

from .bundle_verifiers import cosign_trusted_root, cosign_verify_bundle_attestation
from .catalog_fixtures import entry as image_entry
from .conftest import FIXTURE_PROJECT
from .multiarch_fixtures import MATRIX, RUNTIME, RUNTIME_ARM, build_stand_in
from .policy_eval import shipped_policies_admit
from .publish_fixtures import Workspace, clean_up
from .signing_fixtures import FIRST, KEYS, TEST_PASSWORD, accepted_everything, cosign_accepts, key, store_of

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


def test_the_x86_image_of_a_published_multi_arch_row_matches_its_row_with_its_per_arch_tags():
    """The nightly leaves a published multi-arch row's x86_64 image alone: publish gave it only <tag>-amd64 (the row's
    tag and aliases name the index), which is what the row now asks of it in its group; alone, it asks for both."""
    published = dataclasses.replace(image_entry(X86), versions=versions(GRACE[X86]),
                                    floating=multiarch.image_tags(GRACE[X86], in_group=True))
    assert matches_spec(published, GRACE[X86], multiarch.image_tags(GRACE[X86], in_group=True))
    assert not matches_spec(published, GRACE[X86], multiarch.image_tags(GRACE[X86], in_group=False)), \
        "the arm64 row gone: the x86_64 image takes the row's tag and aliases again"


def test_a_multi_arch_rows_pinned_tags_are_dated_from_the_tags_they_pin():
    """<tag>-<date> pins the index, as <tag> names it: the x86_64 image is pinned from its per-arch tag, as the arm64
    one is; published alone (no index), it keeps the row's tag and its pins."""
    members = multiarch.groups(list(GRACE.values()))[X86]
    assert [multiarch.own_tag(spec, in_group=True) for spec in members] == [f"{X86}-amd64", ARM]
    assert multiarch.own_tag(GRACE[X86], in_group=False) == X86
    index_stem = multiarch.index_tags(members)[0]
    # An x86_64 pin from before indexes had dated tags holds <tag>-<date>: the index's pin takes the next free name.
    existing = [f"{X86}-20260102", f"{X86}-amd64-20260102", f"{ARM}-20260102"]
    assert new_pinned_tag(index_stem, "20260102", existing) == f"{X86}-20260102.2"
    assert new_pinned_tag(index_stem, "20260103", existing) == f"{X86}-20260103"
    assert dated_tags(X86, existing) == [f"{X86}-20260102"], "the per-arch pins are not the index's"
    assert pinned_stems(members) == sorted([X86, f"{X86}-amd64", ARM])


def digest(letter: str) -> str:
    return "sha256:" + letter * 64


def test_prune_deletes_old_indexes_first_and_a_kept_index_keeps_its_images():
    """Two nights: the arm64 image changed on the second, so the first night's index and arm64 image are past a
    retention of 1; the x86_64 image is in both indexes."""
    old_index, new_index, amd64, old_arm, new_arm = (digest(letter) for letter in "abcde")
    tags = {f"{X86}-20260101": old_index, f"{X86}-20260102": new_index, X86: new_index, "latest": new_index,
            f"{X86}-amd64-20260101": amd64, f"{X86}-amd64": amd64,
            f"{ARM}-20260101": old_arm, f"{ARM}-20260102": new_arm, ARM: new_arm}
    members = {old_index: {amd64, old_arm}, new_index: {amd64, new_arm}}
    stems = pinned_stems(multiarch.groups(list(GRACE.values()))[X86])
    plan = prune_plan(stems, tags, 1, members)
    assert list(plan.delete.items()) == [(old_index, [f"{X86}-20260101"]), (old_arm, [f"{ARM}-20260101"])]
    assert plan.kept_shared == {} and plan.kept_in_index == {}

    # A user's own tag on the first night's index keeps it, and with it the arm64 image it names.
    held = prune_plan(stems, {**tags, "prod": old_index}, 1, members)
    assert held.delete == {}
    assert held.kept_shared == {f"{X86}-20260101": "prod"} and held.kept_in_index == {f"{ARM}-20260101": "prod"}


def test_only_manifest_lists_have_members():
    index = multiarch.index_body([multiarch.Member("linux/arm64", ARM, digest("b"), "application/x", 20)])
    image = json.dumps({"schemaVersion": 2, "config": {"digest": digest("c"), "size": 1}, "layers": []}).encode()
    manifests = {X86: Manifest.from_body(index), ARM: Manifest.from_body(image)}
    assert index_members(manifests) == {manifests[X86].digest: {digest("b")}}
    assert multiarch.member_digests(b"not json") == multiarch.member_digests(b'{"manifests": 1}') == set()


def test_the_index_names_each_digest_with_its_platform_deterministically():
    members = [multiarch.Member("linux/amd64", f"{X86}-amd64", "sha256:" + "a" * 64, "application/x", 10),
               multiarch.Member("linux/arm64", ARM, "sha256:" + "b" * 64, "application/x", 20)]
    body = multiarch.index_body(members)
    assert body == multiarch.index_body(members)
    assert json.loads(body)["mediaType"] == multiarch.INDEX_MEDIA_TYPE
    assert multiarch.platforms_of(body) == {"linux/amd64": "sha256:" + "a" * 64, "linux/arm64": "sha256:" + "b" * 64}
    assert multiarch.platforms_of(b"not json") == {} and multiarch.platforms_of(b"[]") == {}


@pytest.fixture
def grace_workspace(tmp_path, engine_env, docker_client):
    space = Workspace(tmp_path, engine_env.registry)
    space.matrix.write_text(MATRIX.format(namespace=space.namespace))
    space.specs = {spec.tag: spec for spec in load_matrix(space.matrix).specs}
    yield space
    clean_up(docker_client, space)


def stored(space: Workspace, reference: str) -> bytes | None:
    """What the registry holds at REPO:tag or REPO@digest (`skopeo inspect --raw`), None when it has nothing there."""
    found = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{space.repository}{reference}"],
                           capture_output=True, timeout=60, check=False)
    return found.stdout if found.returncode == 0 else None


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
    # Each pinned tag dates the tag it pins: <tag>-<date> is the index, as <tag> is; the images' are per-arch.
    assert index["pinned"] == [{"tag": f"{RUNTIME}-20260101", "digest": index["digest"], "date": "2026-01-01"}]
    assert [p["tag"] for p in catalog["images"][RUNTIME]["pinned"]] == [f"{RUNTIME}-amd64-20260101"]
    assert [p["tag"] for p in catalog["images"][RUNTIME_ARM]["pinned"]] == [f"{RUNTIME_ARM}-20260101"]
    assert catalog["images"][RUNTIME_ARM]["floating"] == [RUNTIME_ARM, "latest-arm64"]
    assert catalog["images"][RUNTIME_ARM]["platform"].startswith("linux/arm64")

    # What a user's `skopeo inspect --raw` shows: one index naming both digests with their platforms.
    raw = raw_manifest(f"{space.repository}:{RUNTIME}")
    assert raw["mediaType"] == multiarch.INDEX_MEDIA_TYPE
    assert {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in raw["manifests"]} == per_arch
    assert raw_manifest(f"{space.repository}:latest") == raw == raw_manifest(f"{space.repository}:{RUNTIME}-20260101")

    page = (space.images / "README.md").read_text()
    assert "## Multi-arch tags" in page and index["digest"] in page
    assert all(digest in page for digest in per_arch.values())
    assert f"`docker pull {space.repository}:{RUNTIME}-20260101`" in page
    assert f"`docker pull --platform linux/arm64 {space.repository}@{index['digest']}`" in page

    # `docker pull TAG` on each machine gets its own image: this amd64 engine by default, an arm64 one as --platform.
    for platform, image_id in (("linux/amd64", ids[RUNTIME]), ("linux/arm64", ids[RUNTIME_ARM])):
        reference = f"{space.repository}:{RUNTIME}"
        docker_client.api.remove_image(reference, force=True) if docker_client.images.list(reference) else None
        pulled = docker_client.images.pull(space.repository, tag=RUNTIME, platform=platform)
        assert pulled.id == image_id, f"{platform}: {pulled.id} is not the image published for it"
    # The pin of the multi-arch tag is multi-arch too: an arm64 machine gets its own image from it.
    pinned = docker_client.images.pull(space.repository, tag=f"{RUNTIME}-20260101", platform="linux/arm64")
    assert pinned.id == ids[RUNTIME_ARM]
    docker_client.api.remove_image(f"{space.repository}:{RUNTIME}-20260101")  # the tag only: the image is the test's

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
    assert index["signing"] == {"keys": [key().public.fingerprint], "signature": signature_tag(index["digest"]),
                                "attestation": attestation_tag(index["digest"]),
                                "referrers": bundles.referrers_tag(index["digest"]),
                                "predicate_types": sorted(attestations.PREDICATE_TYPES)}
    # Both formats on the index digest: the real cosign verifies its bundles (the signature statement too).
    root = cosign_trusted_root(space.root)
    for kind in (bundles.SIGN_PREDICATE, *attestations.PREDICATE_TYPES):
        verified = cosign_verify_bundle_attestation(cosign, f"{space.repository}@{index['digest']}", public, kind, root)
        assert verified.returncode == 0, verified.stderr
    # The index is attested too (signing-interop.md finding 1): cosign's `verify-attestation REPO:TAG`, which resolves
    # the tag to the index digest as Kyverno and policy-controller do, accepts all three; so does verify-image, which
    # then checks each platform's image.
    for reference in (f"@{index['digest']}", f":{RUNTIME}", ":latest"):
        assert accepted_everything(cosign, space.repository + reference, public), reference
    checked = space.cli("verify-image", f"{space.repository}:latest", "--key", str(public), "--platform", "all",
                        "--format", "json", check_exit=0)
    verdict = json.loads(checked.stdout)
    assert verdict["verified"] and verdict["digest"] == index["digest"]
    assert verdict["formats"]["signature"] == ["classic", "bundle"]
    assert {platform: found["digest"] for platform, found in verdict["platforms"].items()} == {
        platform: member["digest"] for platform, member in index["platforms"].items()}
    report = verdict["predicates"][attestations.VERIFICATION_PREDICATE]
    assert report["result"] == "passed" and sorted(report["platforms"]) == ["linux/amd64", "linux/arm64"]
    statements = gather_evidence(store_of(space), [key().public], index["digest"], attestations.PREDICATE_TYPES)
    verdicts = shipped_policies_admit(RUNTIME, statements.statements)
    assert all(admitted for admitted, _ in verdicts.values()), verdicts
    text = space.cli("verify-image", f"{space.repository}:{RUNTIME}", "--key", str(public), check_exit=0).stdout
    assert f"@{index['digest']} (index)" in text and "(linux/amd64)" in text and "(linux/arm64)" not in text

    # A republish by the same key writes nothing: the signature tag and the catalog stay as they are.
    signature_digest = space.digest_of(signature_tag(index["digest"]))
    again = space.publish(extra=["--signing-key", str(FIRST)], env=signed)
    assert "3 unchanged" in again.stdout and again.stdout.count("signature present, attestations present") == 3, \
        again.stdout
    assert space.digest_of(signature_tag(index["digest"])) == signature_digest
    assert space.catalog_json() == catalog

    # The next night the x86_64 image changed: a new index, pinned on its own date; the old one keeps its pin.
    build_stand_in(space, docker_client, RUNTIME)
    nightly = space.publish(date="20260102", extra=["--signing-key", str(FIRST)], env=signed)
    assert "2 published, 1 unchanged" in nightly.stdout, nightly.stdout
    renewed = space.catalog_json()["manifest_lists"][RUNTIME]
    assert [p["tag"] for p in renewed["pinned"]] == [f"{RUNTIME}-20260102", f"{RUNTIME}-20260101"]
    assert raw_manifest(f"{space.repository}:{RUNTIME}-20260101") == raw_manifest(f"{space.repository}@{index['digest']}")
    assert cosign_accepts(cosign, f"{space.repository}:{RUNTIME}-20260102", public)

    # Retention 1: the old index goes with its signature (before it), the new one and both its images stay.
    pruned = space.cli("prune", "--registry", space.repository, "--retention", "1", "--catalog", str(space.catalog),
                       check_exit=0)
    said = pruned.stdout + pruned.stderr
    assert said.index(f"deleted {signature_tag(index['digest'])}") < said.index(f"deleted {RUNTIME}-20260101 (")
    assert said.index(f"deleted {RUNTIME}-20260101 (") < said.index(f"deleted {RUNTIME}-amd64-20260101 ("), \
        "the index goes before the image it names"
    assert stored(space, f"@{index['digest']}") is None and space.digest_of(signature_tag(index["digest"])) is None
    assert {tag for tag in space.tags() if DATED_TAG.fullmatch(tag)} == {f"{RUNTIME}-20260102", f"{RUNTIME}-amd64-20260102",
                                                             f"{RUNTIME_ARM}-20260101"}
    kept = raw_manifest(f"{space.repository}:{RUNTIME}")
    assert kept == raw_manifest(f"{space.repository}:{RUNTIME}-20260102")
    assert all(stored(space, f"@{member['digest']}") for member in kept["manifests"]), "a kept index keeps its images"
    assert space.digest_of(signature_tag(renewed["digest"])) is not None
    assert [p["tag"] for p in space.catalog_json()["manifest_lists"][RUNTIME]["pinned"]] == [f"{RUNTIME}-20260102"]
    space.cli("catalog", "--check-registry", "--catalog", str(space.catalog), check_exit=0)


@pytest.mark.engine
def test_a_multi_arch_tag_signed_and_attested_by_cosign_itself_verifies_with_verify_image(grace_workspace, docker_client,
                                                                                          cosign, tmp_path):
    """The other direction on a multi-arch tag (signing-interop.md finding 16): published unsigned, then signed by
    cosign recursively (the index and each image) and each digest attested with cosign by its own statements."""
    space = grace_workspace
    for tag in (RUNTIME, RUNTIME_ARM):
        build_stand_in(space, docker_client, tag)
    space.publish()
    catalog = space.catalog_json()
    index = catalog["manifest_lists"][RUNTIME]
    run_cosign_writes(cosign, "sign", "--key", str(FIRST), "--recursive", f"{space.repository}@{index['digest']}")
    members = {platform: {"digest": member["digest"], "tag": member["tag"], "sbom": {"components": []},
                          "report": cosign_report(catalog["images"][member["image"]])}
               for platform, member in index["platforms"].items()}
    subjects = {index["digest"]: {attestations.VERIFICATION_PREDICATE:
                                  attestations.index_verification_predicate(RUNTIME, members)},
                **{member["digest"]: {attestations.VERIFICATION_PREDICATE: member["report"]}
                   for member in members.values()}}
    for digest, predicates in subjects.items():
        predicates.update({attestations.SBOM_PREDICATE: {"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1},
                           attestations.PROVENANCE_PREDICATE: {"buildDefinition": {"buildType": "https://example.com/ci",
                                                                                   "externalParameters": {}},
                                                               "runDetails": {"builder": {"id": "https://example.com/ci"}}}})
        for number, (kind, predicate) in enumerate(predicates.items()):
            written = tmp_path / f"{digest[7:19]}-{number}.json"
            written.write_text(json.dumps(predicate))
            run_cosign_writes(cosign, "attest", "--key", str(FIRST), "--type", attestations.COSIGN_TYPE_NAMES[kind],
                              "--predicate", str(written), f"{space.repository}@{digest}")
    public = KEYS / "first.pub"
    assert accepted_everything(cosign, f"{space.repository}:{RUNTIME}", public)
    checked = space.cli("verify-image", f"{space.repository}:{RUNTIME}", "--key", str(public), "--platform", "all",
                        "--format", "json")
    verdict = json.loads(checked.stdout)
    assert checked.returncode == 0 and verdict["verified"], verdict
    assert sorted(verdict["platforms"]) == ["linux/amd64", "linux/arm64"]


def run_cosign_writes(cosign, *arguments: str) -> None:
    done = subprocess.run([str(cosign), *arguments, "--tlog-upload=false", "--yes", "--allow-insecure-registry",
                           "--allow-http-registry"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COSIGN_PASSWORD": TEST_PASSWORD})
    assert done.returncode == 0, done.stderr


def cosign_report(entry: dict) -> dict:
    """A verification report another pipeline made for one published image (its own tag and image id)."""
    return {"tool": {"name": "torchimages"}, "tag": entry["tag"], "image_id": entry["image_id"], "result": "passed",
            "verified_at": "2026-01-01T00:00:00Z", "host": {"kind": "cpu-only", "gpu_models": []},
            "checks": {"identity": {"status": "passed", "reason": "", "warnings": []}}}


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


def index_record(pinned: list[PinnedIndex], signing: dict | None = None) -> ManifestList:
    return ManifestList(X86, "localhost:5000/ml/pytorch", digest("a"), [X86, "latest"],
                        {"linux/amd64": {"tag": f"{X86}-amd64", "digest": digest("b"), "image": X86},
                         "linux/arm64": {"tag": ARM, "digest": digest("c"), "image": ARM}},
                        "", signing or {}, pinned)


def test_the_page_says_how_to_pin_pull_and_verify_a_multi_arch_tag_on_either_machine():
    repository = "localhost:5000/ml/pytorch"
    signing = {"keys": [digest("f")], "signature": signature_tag(digest("a"))}
    image = dataclasses.replace(image_entry(X86, aliases=()), repository=repository, floating=[f"{X86}-amd64"])
    index_signing = {**signing, "attestation": attestation_tag(digest("a")),
                     "predicate_types": [attestations.VERIFICATION_PREDICATE]}
    index = index_record([PinnedIndex(f"{X86}-20260102", digest("a"), "2026-01-02"),
                          PinnedIndex(f"{X86}-20260101", digest("d"), "2026-01-01")], index_signing)
    page = readme(Catalog({X86: dataclasses.replace(image, signing={**signing, "attestation": "x", "predicate_types": []})},
                          manifest_lists={X86: index}), "../catalog")
    assert (f"| `{repository}:{X86}` | `{digest('a')}` | 2026-01-02 | `docker pull {repository}:{X86}-20260102` | "
            f"`docker pull {repository}@{digest('a')}` |") in page
    assert (f"| `{repository}:{X86}` | linux/arm64 | `{repository}:{ARM}` | `{digest('c')}` | "
            f"`docker pull {repository}@{digest('c')}` | `docker pull --platform linux/arm64 {repository}@{digest('a')}` |"
            ) in page
    assert f"| `{repository}:latest` | `{digest('a')}` | `{X86}-20260102` |" in page, "the index's floating tags"
    assert f"| `{repository}:{X86}-20260101` | `{digest('d')}` | 2026-01-01 |" in page, "an older pin until pruned"
    key = f"catalog/keys/{'f' * 16}.pub"  # from the project's root, where the commands are run
    reference = f"{repository}@{digest('a')}"
    # The index is attested as an image is: cosign's attestation check and ours, for every platform, work on it.
    assert (f"| {X86} (manifest list) | `{digest('f')}` | "
            f"`cosign verify --key {key} --insecure-ignore-tlog=true {reference}`<br>"
            f"`cosign verify-attestation --key {key} --type {attestations.VERIFICATION_PREDICATE} "
            f"--insecure-ignore-tlog=true {reference}`<br>"
            f"`torchimages verify-image {reference} --key {key} --platform all` |") in page


def test_a_catalog_from_before_index_pins_loads_and_pruned_pins_are_forgotten(tmp_path):
    path = tmp_path / "catalog.json"
    before = {key: value for key, value in dataclasses.asdict(index_record([])).items() if key != "pinned"}
    path.write_text(json.dumps({"schema": 1, "updated_at": "", "images": {}, "manifest_lists": {X86: before}}))
    catalog = load_catalog(path)
    assert catalog.manifest_lists[X86].pinned == []
    catalog.images[X86] = image_entry(X86, aliases=())
    page = readme(catalog, "../catalog")
    assert f"| `{before['repository']}:latest` | `{digest('a')}` | - |" in page
    assert f"| - | not pinned yet: the next publish of the row pins it | `docker pull {before['repository']}@" in page

    pins = [PinnedIndex(f"{X86}-20260102", digest("a"), "2026-01-02"), PinnedIndex(f"{X86}-20260101", digest("d"), "")]
    catalog.manifest_lists[X86] = index_record(pins)
    forget_pinned(catalog, {f"{X86}-20260101"}, tmp_path)
    assert catalog.manifest_lists[X86].pinned == pins[:1]

    broken = {**before, "pinned": [{"tag": "not a tag!", "digest": digest("a"), "date": ""}]}
    path.write_text(json.dumps({"schema": 1, "updated_at": "", "images": {}, "manifest_lists": {X86: broken}}))
    with pytest.raises(InputError) as raised:
        load_catalog(path)
    assert "manifest_lists" in str(raised.value) and "pinned" in str(raised.value) and "git checkout" in str(raised.value)


def test_the_main_job_takes_the_rows_for_the_engines_own_machine():
    """`build.py images` with no selector: an x86_64 engine takes the x86_64 images, a Grace host's engine the -arm64
    ones; an engine that does not say its machine takes every row, as before."""
    from torchimages.cli.rows import for_machine

    specs = list(GRACE.values())
    assert X86 in [spec.tag for spec in for_machine(specs, "x86_64")]
    assert all(not spec.tag.endswith("-arm64") for spec in for_machine(specs, "x86_64"))
    assert [spec.tag for spec in for_machine(specs, "aarch64")] == [s.tag for s in specs if s.tag.endswith("-arm64")]
    assert for_machine(specs, "arm64") == for_machine(specs, "aarch64")
    assert for_machine(specs, "") == specs
