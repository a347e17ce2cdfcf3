"""Trust in both formats: every signed digest carries cosign's classic `.sig`/`.att` tags and Sigstore bundle v0.3
referrers saying the same; verify-image reads both (bundles first, as cosign v3; classic, as cosign 2.x) and refuses
where they disagree. Checked by the real cosign (Debian 13's 2.5: `verify-attestation --new-bundle-format` with an
empty trusted root, classic with its defaults) and by an independent bundle verifier (@sigstore/verify, npm), on
Debian's docker-registry 2.8, which has no referrers API (the referrers tag schema's index is written there).
"""
import datetime as dt
import json
import subprocess
import sys
import textwrap
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from torchimages.peers.registry import RegistryClient, RegistryError, RetryPolicy
from torchimages.peers.registry_access import registry_access
from torchimages.peers.registry_address import Registry
from torchimages.trust import attestations, bundles, keys
from torchimages.trust.referrers import (
    ReferrerStore,
    disagreements,
    gather_both,
    gather_bundle_evidence,
    reconcile,
)
from torchimages.trust.signatures import (
    Evidence,
    SignatureStore,
    UnreadableArtifact,
    attestation_tag,
    signature_tag,
)

from .bundle_verifiers import (
    bundle_schema_errors,
    cosign_trusted_root,
    cosign_verify_bundle_attestation,
    sigstore_js_verify,
)
from .publish_fixtures import RUNTIME, Workspace, clean_up
from .registry_fixtures import start_secure_registry, tiny_image
from .signing_fixtures import DIGEST, FIRST, KEYS, SECOND, SIGNED, accepted_everything, environment, key, store_of

COSIGN_BUNDLE = Path(__file__).parent / "data" / "sigstore" / "cosign-2.5-attestation.bundle.json"
REPORT = attestations.VERIFICATION_PREDICATE

# ------------------------------------------------------------------------------------------------------ pure


def test_a_bundle_opens_for_its_key_and_digest_only_and_carries_cosigns_hint():
    made = bundles.make_bundle(key(), "example.org/ml/pytorch", DIGEST, REPORT, {"status": "passed"})
    assert bundles.open_bundle(key().public, made, DIGEST)["predicate"] == {"status": "passed"}
    assert bundles.bundle_hint(made) == bundles.key_hint(key().public)
    assert bundle_schema_errors(made) == []
    with pytest.raises(keys.SignatureError, match="no signature in the envelope matches"):
        bundles.open_bundle(key(SECOND).public, made, DIGEST)
    with pytest.raises(keys.SignatureError, match="its subject is not"):
        bundles.open_bundle(key().public, made, "sha256:" + "cd" * 32)
    document = json.loads(made)
    document["dsseEnvelope"]["payload"] = document["dsseEnvelope"]["payload"][:-4] + "AAAA"
    with pytest.raises(keys.SignatureError):
        bundles.open_bundle(key().public, json.dumps(document).encode(), DIGEST)
    for broken in (b"[]", b"{}", json.dumps({**json.loads(made), "mediaType": "application/json"}).encode(),
                   json.dumps({"mediaType": bundles.BUNDLE_MEDIA_TYPE, "messageSignature": {}}).encode()):
        with pytest.raises(keys.SignatureError):
            bundles.open_bundle(key().public, broken, DIGEST)


def test_a_bundle_cosign_wrote_opens_here():
    """cosign 2.5's `attest --new-bundle-format` bundle (tests/data/sigstore/README.md says how it was made)."""
    written = COSIGN_BUNDLE.read_bytes()
    subject = json.loads(bundles.base64.b64decode(json.loads(written)["dsseEnvelope"]["payload"]))["subject"][0]
    from torchimages.trust.signing import load_public_key

    public = load_public_key(COSIGN_BUNDLE.with_name("cosign-2.5-attestation.pub"))
    statement = bundles.open_bundle(public, written, "sha256:" + subject["digest"]["sha256"])
    assert isinstance(statement["predicateType"], str)
    assert bundles.bundle_hint(written) == bundles.key_hint(public)


def test_a_referrer_manifest_is_shaped_as_cosigns_and_the_index_lists_it_with_its_predicate_type():
    subject = {"mediaType": bundles.OCI_MANIFEST, "digest": DIGEST, "size": 398}
    bundle = b'{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json"}'
    manifest = bundles.referrer_manifest(subject, REPORT, bundle, dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc))
    document = json.loads(manifest)
    # cosign's WriteReferrer (pkg/oci/remote/write.go at d6d86c2): empty config, one bundle layer, the subject
    assert document["artifactType"] == bundles.BUNDLE_MEDIA_TYPE and document["subject"] == subject
    assert document["config"]["digest"] == bundles.EMPTY_DIGEST == \
        "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    assert document["annotations"] == {"dev.sigstore.bundle.content": "dsse-envelope",
                                       "dev.sigstore.bundle.predicateType": REPORT,
                                       "org.opencontainers.image.created": "2026-11-29T00:00:00Z"}
    entry = bundles.referrer_descriptor(manifest)
    assert entry["artifactType"] == bundles.BUNDLE_MEDIA_TYPE and entry["annotations"] == document["annotations"]
    assert bundles.index_entries(bundles.referrers_index([entry])) == [entry]
    for foreign in (b"{}", b"[]", b'{"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json",'
                                  b'"manifests":[]}', b'{"manifests":[{"size":1}]}'):
        with pytest.raises(ValueError):
            bundles.index_entries(foreign)
    assert bundles.referrers_tag(DIGEST) == "sha256-" + "ab" * 32


def evidence(signed: bool, **statements: list[dict]) -> Evidence:
    found = Evidence(DIGEST, signed_as=["example.org/ml/pytorch"] if signed else [])
    found.statements = {kind.replace("_", "/"): predicates for kind, predicates in statements.items()}
    return found


def test_two_formats_saying_the_same_verify_with_each_statements_formats_named():
    merged = reconcile(evidence(True, report=[{"status": "passed"}]), evidence(True, report=[{"status": "passed"}]))
    assert merged.problems == [] and merged.statements == {"report": [{"status": "passed"}]}
    assert merged.formats == {"signature": ["classic", "bundle"], "report": ["classic", "bundle"]}


def test_one_format_alone_decides_and_the_absent_one_is_only_a_warning():
    absent = evidence(False)
    absent.problems = ["no signature by this key for ..."]
    merged = reconcile(absent, evidence(True, report=[{"status": "passed"}]))
    assert merged.problems == [] and merged.formats["report"] == ["bundle"]
    assert any(warning.startswith("classic format: no signature") for warning in merged.warnings)


@pytest.mark.parametrize("classic, bundled, says", [
    (evidence(True, report=[{"status": "passed"}]), evidence(True, report=[{"status": "failed"}]),
     "disagree on report: 1 statement(s) only in the classic set, 1 only in the bundles"),
    (evidence(True, report=[{"status": "passed"}]), evidence(True, report=[{"status": "passed"}, {"status": "failed"}]),
     "0 statement(s) only in the classic set, 1 only in the bundles"),
    (evidence(True, report=[{}]), evidence(False, report=[{}]), "the classic format holds a signature the bundle"),
    (evidence(True, report=[{}]), evidence(True, report=[{}], sbom=[{}]), "disagree on sbom"),
])
def test_two_formats_that_disagree_refuse_the_digest(classic, bundled, says):
    assert any(says in problem for problem in disagreements(classic, bundled))
    assert any(says in problem for problem in reconcile(classic, bundled).problems)


def test_every_report_of_either_format_is_judged():
    merged = reconcile(evidence(True, report=[{"status": "passed"}]),
                       evidence(True, report=[{"status": "passed"}, {"status": "failed"}]))
    assert merged.statements["report"] == [{"status": "passed"}, {"status": "failed"}]


# ----------------------------------------------------------------------------------------- the real registry


@pytest.fixture
def workspace(tmp_path, engine_env, docker_client):
    space = Workspace(tmp_path, engine_env.registry)
    yield space
    clean_up(docker_client, space)


def referrer_store(space: Workspace) -> ReferrerStore:
    return ReferrerStore(store_of(space).registry)


def verify_image(space: Workspace, reference: str, public: Path = KEYS / "first.pub"):
    return space.cli("verify-image", reference, "--key", str(public))


def test_a_signed_publish_carries_both_formats_each_verified_by_cosign_and_sigstore_js_and_each_alone_verifies(
        workspace, docker_client, cosign, tmp_path):
    workspace.build_verified(docker_client, RUNTIME)
    published = workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    assert "signature added, attestations added, bundles added" in published.stdout
    entry = workspace.catalog_json()["images"][RUNTIME]
    digest = entry["digest"]
    reference = f"{workspace.repository}@{digest}"
    assert entry["signing"]["referrers"] == bundles.referrers_tag(digest)
    # Debian's registry has no referrers API: the referrers tag schema's index lists the five bundles.
    store = referrer_store(workspace)
    entries, by_api = store.entries(digest)
    assert not by_api and bundles.referrers_tag(digest) in workspace.tags()
    kinds = sorted(entry["annotations"][bundles.PREDICATE_ANNOTATION] for entry in entries)
    assert kinds == sorted([bundles.SIGN_PREDICATE, *attestations.PREDICATE_TYPES])
    referrers, skipped = store.read(digest)
    assert skipped == [] and len(referrers) == 4

    # The real cosign: each bundle (the signature statement too) with --new-bundle-format, and the classic set.
    root = cosign_trusted_root(tmp_path)
    public = KEYS / "first.pub"
    for kind in (bundles.SIGN_PREDICATE, *attestations.PREDICATE_TYPES):
        verified = cosign_verify_bundle_attestation(cosign, reference, public, kind, root)
        assert verified.returncode == 0, verified.stderr
        assert cosign_verify_bundle_attestation(cosign, reference, KEYS / "second.pub", kind, root).returncode != 0
    assert accepted_everything(cosign, reference, public)
    # An independent verifier (@sigstore/verify) and the protobuf-specs schema, each bundle.
    for referrer in referrers:
        assert bundle_schema_errors(referrer.bundle) == []
        assert sigstore_js_verify(referrer.bundle, public.read_text(), digest)[0]
        assert not sigstore_js_verify(referrer.bundle, (KEYS / "second.pub").read_text(), digest)[0]

    both = verify_image(workspace, reference)
    assert both.returncode == 0, both.stdout + both.stderr
    assert "(key " in both.stdout and "[classic, bundle]" in both.stdout

    # The classic tags deleted: the bundles alone verify (as cosign v3 reads them).
    registry = store_of(workspace).registry
    saved = {tag: registry.manifest(tag) for tag in (signature_tag(digest), attestation_tag(digest))}
    for tag in saved:
        registry.delete(registry.digest_of(tag))
    alone = verify_image(workspace, reference)
    assert alone.returncode == 0 and "[bundle]" in alone.stdout and "[classic" not in alone.stdout, alone.stdout
    # Publish puts the classic set back; then the bundles deleted: the classic set alone verifies (cosign 2.x).
    workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    assert store.remove(digest)
    classic = verify_image(workspace, reference)
    assert classic.returncode == 0 and "[classic]" in classic.stdout and "bundle]" not in classic.stdout


def test_a_failed_report_cosign_attests_as_a_bundle_with_the_same_key_refuses_the_digest(
        workspace, docker_client, cosign, tmp_path):
    workspace.build_verified(docker_client, RUNTIME)
    workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    digest = workspace.catalog_json()["images"][RUNTIME]["digest"]
    reference = f"{workspace.repository}@{digest}"
    report = store_of(workspace)
    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps({"result": "failed", "tag": RUNTIME}))
    attested = subprocess.run(
        [str(cosign), "attest", "--yes", "--new-bundle-format", "--key", str(FIRST), "--tlog-upload=false",
         "--allow-insecure-registry", "--allow-http-registry", "--type", REPORT, "--predicate", str(failed), reference],
        capture_output=True, text=True, timeout=120, env=environment(**SIGNED), check=False)
    assert attested.returncode == 0, attested.stderr
    refused = verify_image(workspace, reference)
    assert refused.returncode == 1, refused.stdout
    assert "disagree on https://torchimages.io/verification-report/v1" in refused.stdout
    assert "REFUSES" in refused.stdout  # the failed report itself, judged by the report rule
    assert report.registry.digest_of(signature_tag(digest))


def test_signature_format_writes_only_what_is_asked(workspace, docker_client):
    workspace.build_verified(docker_client, RUNTIME)
    classic = workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST), "--signature-format", "classic"],
                                env=environment(**SIGNED))
    digest = workspace.catalog_json()["images"][RUNTIME]["digest"]
    assert "bundles" not in classic.stdout and bundles.referrers_tag(digest) not in workspace.tags()
    assert verify_image(workspace, f"{workspace.repository}@{digest}").returncode == 0
    bundled = workspace.publish(RUNTIME, extra=["--signing-key", str(SECOND), "--signature-format", "bundle"],
                                env=environment(**SIGNED))
    assert "bundles added" in bundled.stdout and "signature added" not in bundled.stdout
    assert bundles.referrers_tag(digest) in workspace.tags()
    second = verify_image(workspace, f"{workspace.repository}@{digest}", KEYS / "second.pub")
    assert second.returncode == 0 and "[bundle]" in second.stdout, second.stdout


CONCURRENT_ATTEST = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from tests.signing_fixtures import key
    from torchimages.peers.registry import RegistryClient, RegistryError, RetryPolicy
    from torchimages.peers.registry_access import registry_access
    from torchimages.peers.registry_address import Registry
    from torchimages.trust import bundles
    from torchimages.trust.referrers import ReferrerStore
    registry = Registry({host!r}, {repository!r})
    store = ReferrerStore(RegistryClient(registry, registry_access(registry), RetryPolicy(retries=3), print))
    print(store.attest(key(Path({key_file!r})), {digest!r}, {subject!r},
                       {{bundles.SIGN_PREDICATE: {{}}, "https://example.org/{name}/v1": {{"by": {name!r}}}}}))
""")


def test_two_concurrent_writers_of_one_digests_referrers_index_keep_every_referrer(workspace, docker_client):
    workspace.build_verified(docker_client, RUNTIME)
    workspace.publish(RUNTIME)  # unsigned
    digest = workspace.catalog_json()["images"][RUNTIME]["digest"]
    registry = store_of(workspace).registry
    manifest = registry.manifest(digest)
    subject = {"mediaType": manifest.media_type, "digest": digest, "size": len(manifest.body)}
    root = str(Path(__file__).resolve().parent.parent)
    writers = [subprocess.Popen([sys.executable, "-c", CONCURRENT_ATTEST.format(
        root=root, host=registry.registry.host, repository=registry.registry.repository, key_file=str(path),
        digest=digest, subject=subject, name=name)], env=environment(**SIGNED)) for name, path in (("first", FIRST), ("second", SECOND))]
    assert [writer.wait(timeout=300) for writer in writers] == [0, 0]
    entries, _ = referrer_store(workspace).entries(digest)
    listed = [entry["annotations"][bundles.PREDICATE_ANNOTATION] for entry in entries]
    assert sorted(listed) == sorted([bundles.SIGN_PREDICATE, bundles.SIGN_PREDICATE,
                                     "https://example.org/first/v1", "https://example.org/second/v1"])


# -------------------------------------------------------------------------------- hostile referrers, a registry of its own

@pytest.fixture
def own_client(own_registry) -> RegistryClient:
    registry = Registry(own_registry[1], "hostile/pytorch")
    return RegistryClient(registry, registry_access(registry), RetryPolicy(retries=0), lambda _: None)


PREDICATES = {bundles.SIGN_PREDICATE: {}, **{kind: {"result": "passed"} for kind in attestations.PREDICATE_TYPES}}


def test_foreign_content_at_the_referrers_tag_vouches_for_nothing_and_is_never_rewritten(own_client):
    digest, subject = tiny_image(own_client)
    SignatureStore(own_client).sign(key(), digest)
    SignatureStore(own_client).attest(key(), digest, {kind: {"result": "passed"} for kind in attestations.PREDICATE_TYPES})
    own_client.copy_tag(digest, bundles.referrers_tag(digest))  # an image, not an index, at sha256-<hex>
    with pytest.raises(UnreadableArtifact, match="not ours to rewrite"):
        ReferrerStore(own_client).attest(key(), digest, subject, PREDICATES)
    assert own_client.digest_of(bundles.referrers_tag(digest)) == digest
    found = gather_both(own_client, [key().public], digest, attestations.PREDICATE_TYPES)
    assert found.problems == [] and found.formats["signature"] == ["classic"]
    assert any("bundle format" in warning and "nothing in it was read" in warning for warning in found.warnings)


def test_referrers_that_are_no_bundle_of_the_key_about_the_digest_are_skipped_with_a_warning(own_client):
    digest, subject = tiny_image(own_client)
    other, other_subject = tiny_image(own_client)
    store = ReferrerStore(own_client)
    store.attest(key(), digest, subject, PREDICATES)
    store.attest(key(SECOND), other, other_subject, {bundles.SIGN_PREDICATE: {}})
    # Another digest's bundle, and another key's bundle about this digest, listed in this digest's index.
    foreign_entries, _ = store.entries(other)
    entries, _ = store.entries(digest)
    own_client.write_referrers_index(bundles.referrers_index([*entries, *foreign_entries]),
                                     bundles.referrers_tag(digest))
    store.attest(key(SECOND), digest, subject, {REPORT: {"result": "failed"}})
    found = gather_bundle_evidence(store, [key().public], digest, attestations.PREDICATE_TYPES)
    assert found.problems == [] and found.statements[REPORT] == [{"result": "passed"}]
    assert sum("is no bundle these keys signed" in warning for warning in found.warnings) == 2


def test_a_new_report_replaces_the_keys_older_one_in_both_formats_so_they_still_agree(own_client):
    digest, subject = tiny_image(own_client)
    classic, bundled = SignatureStore(own_client), ReferrerStore(own_client)
    first = {kind: {"result": "passed", "host": "cpu-only"} for kind in attestations.PREDICATE_TYPES}
    classic.sign(key(), digest)
    classic.attest(key(), digest, first)
    assert bundled.attest(key(), digest, subject, {bundles.SIGN_PREDICATE: {}, **first}) == "added"
    older, _ = bundled.entries(digest)
    again = {**first, REPORT: {"result": "passed", "host": "gpu"}}  # verified again, on a GPU host
    assert classic.attest(key(), digest, again, frozenset({REPORT})) == "replaced"
    assert bundled.attest(key(), digest, subject, {bundles.SIGN_PREDICATE: {}, **again}, frozenset({REPORT})) == \
        "replaced"
    newer, _ = bundled.entries(digest)
    assert len(newer) == len(older) == 4
    gone = {entry["digest"] for entry in older} - {entry["digest"] for entry in newer}
    assert len(gone) == 1 and own_client.digest_of(gone.pop()) is None  # the superseded referrer is deleted
    found = gather_both(own_client, [key().public], digest, attestations.PREDICATE_TYPES)
    assert found.problems == [] and found.statements[REPORT] == [{"result": "passed", "host": "gpu"}]
    assert found.formats[REPORT] == ["classic", "bundle"]


def test_what_cosign_itself_writes_in_the_bundle_format_verifies_here(own_client, cosign, tmp_path):
    """cosign 2.5's `attest --new-bundle-format` for each statement, the cosign/sign/v1 signature statement included
    (cosign v3's `sign` writes that very statement; 2.5's `sign` has no bundle format)."""
    digest, _ = tiny_image(own_client)
    reference = f"{own_client.registry.name}@{digest}"
    for kind, predicate in PREDICATES.items():
        path = tmp_path / "predicate.json"
        path.write_text(json.dumps(predicate))
        written = subprocess.run(
            [str(cosign), "attest", "--yes", "--new-bundle-format", "--key", str(FIRST), "--tlog-upload=false",
             "--allow-insecure-registry", "--allow-http-registry", "--type", kind, "--predicate", str(path), reference],
            capture_output=True, text=True, timeout=120, env=environment(**SIGNED), check=False)
        assert written.returncode == 0, written.stderr
    found = gather_both(own_client, [key().public], digest, attestations.PREDICATE_TYPES)
    assert found.problems == [] and found.signed_as == [own_client.registry.name]
    assert found.formats == {kind if kind != bundles.SIGN_PREDICATE else "signature": ["bundle"] for kind in PREDICATES}
    assert gather_both(own_client, [key(SECOND).public], digest, attestations.PREDICATE_TYPES).problems


def test_signatures_naming_different_repositories_in_the_two_formats_disagree():
    """podman checks the classic signature's docker-reference, Kyverno's ImageValidatingPolicy the bundle's."""
    classic, bundled = evidence(True), evidence(True)
    classic.signed_as = ["evil.example.com/other/pytorch"]
    assert disagreements(classic, bundled) == ["the formats' signatures name different repositories: classic "
                                               "evil.example.com/other/pytorch, bundle example.org/ml/pytorch"]


@pytest.mark.parametrize("bearer", [False, True], ids=["basic", "bearer"])
def test_the_referrers_index_is_written_through_the_registrys_login_and_ca(tmp_path, bearer):
    """The index is PUT by HTTP (skopeo 1.9 drops artifactType): with the login `docker login` wrote, Basic or a
    Bearer token from the registry's token server, over TLS verified against its CA, as skopeo reaches it."""
    secure = start_secure_registry(tmp_path / "registry", f"pw-{uuid.uuid4().hex}", bearer=bearer)
    try:
        registry = Registry(secure.host, "ml/pytorch")
        access = registry_access(registry, config_dir=secure.docker_config, certs_d=secure.certs_d)
        client = RegistryClient(registry, access, RetryPolicy(retries=0), lambda _: None)
        digest, subject = tiny_image(client)
        assert ReferrerStore(client).attest(key(), digest, subject, PREDICATES) == "added"
        assert client.referrers(digest) is None  # docker-registry 2.8 has no referrers API
        entries, by_api = ReferrerStore(client).entries(digest)
        assert not by_api and all(entry["artifactType"] == bundles.BUNDLE_MEDIA_TYPE for entry in entries)
        found = gather_bundle_evidence(ReferrerStore(client), [key().public], digest, attestations.PREDICATE_TYPES)
        assert found.problems == [] and len(entries) == 4
        # Without the login the PUT is refused in one line that holds no secret.
        (secure.docker_config / "config.json").unlink()
        anonymous = RegistryClient(registry, registry_access(registry, config_dir=secure.docker_config,
                                                             certs_d=secure.certs_d), RetryPolicy(retries=0),
                                   lambda _: None)
        with pytest.raises(RegistryError) as refused:
            anonymous.write_referrers_index(bundles.referrers_index([]), bundles.referrers_tag(digest))
        assert secure.password not in str(refused.value) and "\n" not in str(refused.value)
    finally:
        secure.stop()


def answering_referrers(body: bytes, content_type: str = bundles.OCI_INDEX) -> ThreadingHTTPServer:
    """A stand-in registry that answers the referrers API (docker-registry 2.8, the one here, has none)."""
    class Referrers(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            found = "/referrers/" in self.path
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", content_type if found else "text/plain")
            self.send_header("Content-Length", str(len(body) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Referrers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("body, content_type, listed", [
    (bundles.referrers_index([{"digest": DIGEST, "size": 1}]), bundles.OCI_INDEX, True),
    (bundles.referrers_index([]), "application/json", False),  # not an index: no API
    (b"x" * ((4 << 20) + 1), bundles.OCI_INDEX, False),  # past the bound: no answer
])
def test_a_registry_with_the_referrers_api_is_asked_there(body, content_type, listed):
    server = answering_referrers(body, content_type)
    try:
        registry = Registry(f"127.0.0.1:{server.server_address[1]}", "ml/pytorch")
        client = RegistryClient(registry, registry_access(registry), RetryPolicy(retries=0), lambda _: None)
        assert (client.referrers(DIGEST) == body) is listed
        if listed:
            assert ReferrerStore(client).entries(DIGEST) == ([{"digest": DIGEST, "size": 1}], True)
    finally:
        server.shutdown()
