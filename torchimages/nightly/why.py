"""Why a row runs again: the nightly's decision as pure functions over what the catalog, the registry, the engine and
the build's inputs say, so that `build.py why TAG` prints exactly the reasons the nightly acts on.

A row is left alone when it is published with today's inputs (publish_reasons is empty) and its OS has no security
fix it lacks; otherwise it is built unless the engine's image already has today's inputs (build_reasons is empty),
then verified and published. A row behind only on security fixes rebuilds its OS security layer alone.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..build.builder import Builder, read_wheel_record, wheel_record_path
from ..build.context import input_hash
from ..model import ImageSpec
from ..peers.registry import RegistryClient
from ..publish.catalog import Catalog, CatalogEntry, matches_spec
from ..publish.multiarch import image_tags

# A published row -> (the OS security fixes its digest lacks, in words; why they could not be looked up), "" for none.
SecurityLookup = Callable[[ImageSpec, CatalogEntry], tuple[str, str]]


@dataclass(frozen=True)
class RowState:
    """What the decision reads about one row."""

    tag: str
    inputs: dict[str, str] | None  # each build input now (builder.build_inputs); None: nothing identifies the base
    input_hash: str | None  # the hash of inputs
    built_inputs: dict[str, str]  # each input at this checkout's last build of the row ({}: none recorded)
    engine_hash: str | None  # the input hash the engine's image of the row was built with (None: no image)
    entry: CatalogEntry | None  # what the catalog says is published
    entry_matches_row: bool  # the entry's tags, versions and deprecation are the row's
    repository: str  # where this run publishes
    signing_key: str | None  # the fingerprint of this run's signing key
    registry_digests: dict[str, str] | None  # the registry's digest of each of the entry's tags (None: not asked)
    forced: bool  # --force or --no-cache
    security_fixes: str = ""  # what the OS's security pocket fixed that the published digest lacks ("": none, or not asked)
    security_unknown: str = ""  # why the security pocket could not say (the nightly then leaves the row as it is)
    index_keys: list[str] | None = None  # who signed the manifest list over the row's machines (None: it has none)
    index_unpinned: bool = False  # the row's manifest list has no dated tag (published before indexes had them)


def input_changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """The inputs that differ, by name: what was added, removed or changed (with both values where they are short)."""
    changes = [f"added {name}" for name in sorted(now.keys() - before.keys())]
    changes += [f"removed {name}" for name in sorted(before.keys() - now.keys())]
    for name in sorted(before.keys() & now.keys()):
        if before[name] != now[name]:
            short = max(len(before[name]), len(now[name])) <= 40
            changes.append(f"{name}: {before[name]} -> {now[name]}" if short else f"changed {name}")
    return changes


WHEEL = "wheel "  # the build inputs a served wheel adds (build/context.py build_inputs): "wheel <file name>"
FROM_WHEELHOUSE = "inputs differ only in where the wheels come from: pass --wheelhouse as the build did"
FROM_INDEX = ("inputs differ only in where the wheels come from: the build installed them from the package index; "
              "leave out --wheelhouse as it did")


def wheel_source_change(before: dict[str, str], now: dict[str, str] | None) -> str:
    """FROM_WHEELHOUSE or FROM_INDEX where the two sets of inputs are the same but for the wheels, which one of them
    was served (from a wheelhouse, by name and size) and the other installed from the index; "" otherwise. Where the
    wheels come from is not itself an input: a wheelhouse in another folder holding the same wheels changes nothing."""
    if not before or now is None:
        return ""
    def others(inputs: dict[str, str]) -> dict[str, str]:
        return {name: value for name, value in inputs.items() if not name.startswith(WHEEL)}
    served_before, served_now = (any(name.startswith(WHEEL) for name in inputs) for inputs in (before, now))
    if served_before == served_now or others(before) != others(now):
        return ""
    return FROM_WHEELHOUSE if served_before else FROM_INDEX


def publish_reasons(state: RowState) -> list[str]:
    """Why the nightly runs this row at all; empty when it is published with today's inputs, as asked."""
    if state.forced:
        return ["--force or --no-cache: every selected row runs"]
    entry = state.entry
    if entry is None:
        return [f"the catalog has no entry for {state.tag}: it was never published here"]
    reasons = []
    if entry.repository != state.repository:
        reasons.append(f"published to {entry.repository}; this run publishes to {state.repository}")
    if not state.entry_matches_row:
        reasons.append("the catalog's tags, versions or deprecation differ from the matrix row's")
    if state.signing_key and state.signing_key not in entry.signing.get("keys", []):
        reasons.append(f"not signed yet by this run's key {state.signing_key}")
    elif state.signing_key and state.index_keys is not None and state.signing_key not in state.index_keys:
        # `cosign verify TAG` and admission controllers resolve a multi-arch tag to the index: it is signed on its own.
        reasons.append(f"its manifest list is not signed yet by this run's key {state.signing_key}")
    if state.index_unpinned:
        # Only a dated tag keeps an index (and every `REPO@sha256:<index>` pin) alive when the row's tag moves on.
        reasons.append("its manifest list has no dated tag yet: publishing again pins it")
    if state.input_hash is None:
        reasons.append("nothing identifies its base: not on the engine and not in bases.lock.json")
    elif state.input_hash != entry.input_hash:
        source = _wheel_source_after(state.built_inputs, state.inputs, entry.input_hash)
        reasons.append(f"{source} (input hash {entry.input_hash or 'none'} -> {state.input_hash})" if source else
                       f"its inputs changed since it was published (input hash {entry.input_hash or 'none'} -> "
                       f"{state.input_hash}){_changes_after(state.built_inputs, state.inputs, entry.input_hash)}")
    for tag, digest in sorted((state.registry_digests or {}).items()):
        if digest != entry.digest:
            reasons.append(f"the registry's {tag} names {digest or 'nothing'}, the catalog {entry.digest}")
    return reasons


def build_reasons(state: RowState) -> list[str]:
    """Why the row would be built here; empty when the engine's image already has today's inputs."""
    if state.forced:
        return ["--force or --no-cache: built again whatever the engine has"]
    if state.engine_hash is None:
        return ["the engine has no image of it"]
    if state.input_hash != state.engine_hash:
        source = _wheel_source_after(state.built_inputs, state.inputs, state.engine_hash)
        return [f"the engine's image was built with the same inputs, but {source}" if source else
                f"the engine's image was built from other inputs{_changes_after(state.built_inputs, state.inputs)}"]
    return []


def _wheel_source_after(built: dict[str, str], now: dict[str, str] | None, compared_hash: str | None) -> str:
    """wheel_source_change since the last build here, when that build is the one compared with (its hash)."""
    return wheel_source_change(built, now) if built and compared_hash and input_hash(built) == compared_hash else ""


def wheels_only(state: RowState) -> str:
    """The wheel-source message where it is the one reason the row would run ("" otherwise): then the row is as
    published, given the wheels the build had."""
    reasons = publish_reasons(state)
    return next((source for source in (FROM_WHEELHOUSE, FROM_INDEX) if len(reasons) == 1
                 and reasons[0].startswith(source)), "")


def _changes_after(built: dict[str, str], now: dict[str, str] | None, published_hash: str | None = None) -> str:
    """The changed inputs since the last build here, when that build is the one compared with."""
    if not built or now is None or (published_hash and input_hash(built) != published_hash):
        return ""
    changes = input_changes(built, now)
    return f": {'; '.join(changes)}" if changes else ""


# ------------------------------------------------------------------------------------------ reading the row's state

def read_row_state(builder: Builder, spec: ImageSpec, catalog: Catalog, repository: str,
                   signing_key: str | None, registry: RegistryClient | None = None,
                   security: SecurityLookup | None = None, in_group: bool = False) -> RowState:
    """The row as the engine, the reports folder and the catalog see it now; the registry is asked for the entry's
    tags, and security for the published digest's missing OS fixes, only when given and nothing else already decides
    that the row runs (a question per row saved). in_group: the row is published as one machine's image of a
    multi-arch tag (multiarch.groups of the rows published together), so its entry has its per-arch tags."""
    entry, index = catalog.images.get(spec.tag), catalog.manifest_lists.get(spec.index_tag or spec.tag)
    inputs = builder.current_inputs(spec)
    record = read_wheel_record(wheel_record_path(builder.options.reports_dir, spec.tag))
    state = RowState(
        tag=spec.tag, inputs=inputs, input_hash=input_hash(inputs) if inputs is not None else None,
        built_inputs=record.get("inputs", {}), engine_hash=builder.engine_input_hash(spec), entry=entry,
        entry_matches_row=entry is not None and matches_spec(entry, spec, image_tags(spec, in_group)), repository=repository,
        signing_key=signing_key, registry_digests=None, forced=builder.options.force or builder.options.no_cache,
        index_keys=index.signing.get("keys", []) if index else None, index_unpinned=index is not None and not index.pinned)
    if entry is None or publish_reasons(state):
        return state
    if registry is not None:
        tags = [*entry.floating, entry.pinned[0].tag]
        found = registry.tag_digests(tags)
        state = replace(state, registry_digests={tag: found.get(tag, "") for tag in tags})
    if security is None or publish_reasons(state):
        return state
    fixes, unknown = security(spec, entry)
    return replace(state, security_fixes=fixes, security_unknown=unknown)


# ---------------------------------------------------------------------------------------------- what `why` prints

def decision(state: RowState) -> str:
    """nothing: published with today's inputs; verify and publish: the engine's image is current; else build."""
    if not publish_reasons(state):
        return "rebuild the OS security layer, verify, publish" if state.security_fixes else "nothing"
    return wheels_only(state) or ("build, verify, publish" if build_reasons(state) else "verify, publish")


def decision_document(state: RowState) -> dict:
    return {"tag": state.tag, "decision": decision(state), "publish_reasons": publish_reasons(state),
            "build_reasons": build_reasons(state) if publish_reasons(state) else [],
            "security_fixes": state.security_fixes, "security_unknown": state.security_unknown, "registry_asked": state.registry_digests is not None}


def explain(state: RowState) -> str:
    document = decision_document(state)
    lines = [f"{state.tag}: {document['decision']}"]
    if wheels_only(state):
        return "\n".join([*lines, "  with the build's wheels its inputs are the published ones; as given, it would be "
                                   "built again"])
    if not document["publish_reasons"]:
        asked = "its tags on the registry name the catalog's digest" if document["registry_asked"] else \
            "the registry was not asked (--offline)"
        lines.append(f"  published with today's inputs; {asked}")
        if state.security_fixes:
            lines.append(f"  - its OS has security fixes the published digest lacks: {state.security_fixes}")
        if state.security_unknown:
            lines.append(f"  its OS's security fixes could not be looked up: {state.security_unknown}")
    lines += [f"  - {reason}" for reason in document["publish_reasons"]]
    if document["publish_reasons"]:
        lines.append("  the engine's image has today's inputs: up to date, not built again" if not document["build_reasons"]
                     else f"  builds because {'; '.join(_not_again(document['build_reasons'], document['publish_reasons']))}")
    return "\n".join(lines)


def _not_again(reasons: list[str], above: list[str]) -> list[str]:
    """reasons, each list of changed inputs that a line above already gives (the same build compared) left out."""
    shown = []
    for reason in reasons:
        cause, _, changes = reason.partition(": ")
        shown.append(f"{cause} (the changes above)" if changes and any(changes in line for line in above) else reason)
    return shown
