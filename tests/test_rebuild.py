"""The nightly's decision per row (torchimages/nightly/why.py), as pure functions: each reason a row runs again, and none
when it is published with today's inputs. End to end (a real engine, registry and catalog) in test_publish's nightly
tests and `build.py why` there."""
from __future__ import annotations

from dataclasses import replace

import pytest

from torchimages.build.context import input_hash
from torchimages.nightly.why import RowState, build_reasons, decision, explain, input_changes, publish_reasons
from torchimages.publish.catalog import CatalogEntry, PinnedTag

TAG = "2.14.1-cpu-runtime"
DIGEST = "sha256:" + "a" * 64
BUILT = {"file Dockerfile": "1" * 64, "wheel torch-2.14.1-cp311-none-linux_x86_64.whl":
         "190000000 bytes", "index PIP_INDEX_URL": "https://pypi.org/simple", "base": "sha256:" + "b" * 64}


def entry(**changes) -> CatalogEntry:
    published = CatalogEntry(
        tag=TAG, repository="127.0.0.1:5000/ml/pytorch", digest=DIGEST, image_id="sha256:" + "c" * 64,
        pinned=[PinnedTag(f"{TAG}-20261125", DIGEST, "2026-11-25", "sbom.json")], floating=[TAG, "latest-cpu"],
        versions={}, size=1, download_size=1, checks={}, scan={}, sbom="sbom.json", published_at="", updated_at="",
        input_hash=input_hash(BUILT), signing={"keys": ["0123456789abcdef"]})
    return replace(published, **changes)


def state(**changes) -> RowState:
    published = RowState(
        tag=TAG, inputs=dict(BUILT), input_hash=input_hash(BUILT), built_inputs=dict(BUILT),
        engine_hash=input_hash(BUILT), entry=entry(), entry_matches_row=True, repository="127.0.0.1:5000/ml/pytorch",
        signing_key="0123456789abcdef", registry_digests={TAG: DIGEST, "latest-cpu": DIGEST, f"{TAG}-20261125": DIGEST},
        forced=False)
    return replace(published, **changes)


def with_inputs(**changed: str) -> RowState:
    inputs = {**BUILT, **changed}
    return state(inputs=inputs, input_hash=input_hash(inputs))


def test_a_row_published_with_todays_inputs_is_left_alone():
    current = state()
    assert publish_reasons(current) == [] and decision(current) == "nothing"
    assert "its tags on the registry name the catalog's digest" in explain(current)


def test_a_multi_arch_row_whose_index_this_key_signed_is_left_alone():
    """The index is signed apart from its images (cosign resolves the row's tag to it); signed by this key: done."""
    assert publish_reasons(state(index_keys=["0123456789abcdef"])) == []


def test_the_registry_not_asked_is_said_so_and_decides_nothing():
    offline = state(registry_digests=None)
    assert decision(offline) == "nothing" and "--offline" in explain(offline)


@pytest.mark.parametrize("changes, reason", [
    ({"entry": None}, "the catalog has no entry for 2.14.1-cpu-runtime: it was never published here"),
    ({"repository": "registry.example.com/ml/pytorch"},
     "published to 127.0.0.1:5000/ml/pytorch; this run publishes to registry.example.com/ml/pytorch"),
    ({"entry_matches_row": False}, "the catalog's tags, versions or deprecation differ from the matrix row's"),
    ({"signing_key": "fedcba9876543210"}, "not signed yet by this run's key fedcba9876543210"),
    ({"index_keys": []}, "its manifest list is not signed yet by this run's key 0123456789abcdef"),
    ({"index_unpinned": True}, "its manifest list has no dated tag yet: publishing again pins it"),
    ({"inputs": None, "input_hash": None}, "nothing identifies its base: not on the engine and not in bases.lock.json"),
    ({"registry_digests": {TAG: DIGEST, "latest-cpu": "sha256:" + "d" * 64}},
     f"the registry's latest-cpu names sha256:{'d' * 64}, the catalog {DIGEST}"),
    ({"registry_digests": {TAG: ""}}, f"the registry's {TAG} names nothing, the catalog {DIGEST}"),
    ({"forced": True}, "--force or --no-cache: every selected row runs"),
])
def test_each_reason_a_published_row_runs_again(changes, reason):
    assert publish_reasons(state(**changes)) == [reason]


def test_an_entry_without_an_input_hash_is_never_taken_as_current():
    [reason] = publish_reasons(state(entry=entry(input_hash="")))
    assert reason.startswith("its inputs changed since it was published (input hash none -> ")


def test_changed_inputs_are_named_one_by_one():
    wheel = "wheel torch-2.14.1-cp311-none-linux_x86_64.whl"
    changed = with_inputs(**{"file Dockerfile": "2" * 64, wheel: "190000001 bytes", "index PIP_INDEX_URL":
                             "https://mirror.example/simple"})
    [reason] = publish_reasons(changed)
    assert reason.endswith(f": changed file Dockerfile; index PIP_INDEX_URL: https://pypi.org/simple -> "
                           f"https://mirror.example/simple; {wheel}: 190000000 bytes -> 190000001 bytes")
    assert decision(changed) == "build, verify, publish"
    assert build_reasons(changed)[0].startswith("the engine's image was built from other inputs: changed file")


def test_inputs_are_compared_only_with_the_build_the_catalog_published():
    """A later local build (other inputs) is not what was published: its inputs would name the wrong changes."""
    later_build = {**BUILT, "file Dockerfile": "3" * 64}
    changed = replace(with_inputs(**{"file Dockerfile": "2" * 64}), built_inputs=later_build)
    [reason] = publish_reasons(changed)
    assert reason.endswith(")") and "Dockerfile" not in reason


def test_a_current_engine_image_skips_the_build_but_not_the_publish():
    unsigned = state(signing_key="fedcba9876543210")
    assert build_reasons(unsigned) == [] and decision(unsigned) == "verify, publish"
    assert "the engine's image has today's inputs: up to date, not built again" in explain(unsigned)


def test_no_engine_image_is_a_build_reason():
    assert build_reasons(state(engine_hash=None)) == ["the engine has no image of it"]


def test_input_changes_lists_added_removed_and_changed_inputs():
    assert input_changes({"a": "1", "b": "2"}, {"b": "3", "c": "4"}) == ["added c", "removed a", "b: 2 -> 3"]


def test_a_row_behind_only_on_os_security_fixes_rebuilds_its_security_layer():
    behind = state(security_fixes="libssl3 3.0.19-1~deb12u1 -> 3.0.22-1~deb12u2 (CVE-2026-90002)")
    assert publish_reasons(behind) == [] and decision(behind) == "rebuild the OS security layer, verify, publish"
    assert "security fixes the published digest lacks: libssl3 3.0.19-1~deb12u1 -> 3.0.22-1~deb12u2" in explain(behind)


def test_a_security_pocket_that_cannot_say_leaves_the_row_as_it_is_and_says_why():
    unknown = state(security_unknown="bookworm-security: its Release file is signed by an unknown key")
    assert decision(unknown) == "nothing" and "could not be looked up: bookworm-security" in explain(unknown)
