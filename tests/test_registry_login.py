"""Publishing to a registry that wants a login over TLS (tests/registry_fixtures.py: Debian's docker-registry with
htpasswd and a certificate from a CA the test makes), with credentials found as Docker finds them.

Covers publish, floating tags moved by digest, prune, lock resolving digests, a wrong password (clear message,
exit 1, nothing half-published, the catalog byte for byte), credential helpers, the CA trusted from certs.d or by a
flag, and that no credential reaches a log, report, catalog or image. The nightly tests build the real CPU rows.
"""
import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import docker.errors
import pytest
import yaml

from torchimages.build.builder import BUILDERS, Builder, BuildOptions, cache_name, local_name
from torchimages.build.lock import Resolver
from torchimages.peers.registry import RegistryClient, RetryPolicy
from torchimages.peers.registry_access import RegistryAccess, registry_access
from torchimages.peers.registry_address import image_registry
from torchimages.redaction import Secrets

from .conftest import CPU_SELECTOR, ROOT, run_cli
from .publish_fixtures import DEVEL, RUNTIME, Workspace
from .publish_fixtures import nightly as run_nightly
from .registry_fixtures import USER, make_certificates, start_secure_registry

pytestmark = pytest.mark.engine
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


@pytest.fixture(scope="session")
def secure_registry(tmp_path_factory, engine_env):
    """Basic auth (htpasswd) on every request."""
    registry = start_secure_registry(tmp_path_factory.mktemp("secure-registry"), f"pw-{uuid.uuid4().hex}")
    yield registry
    registry.stop()


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory, engine_env):
    """Bearer tokens from a token server, as Harbor, GHCR and Docker Hub hand them out."""
    registry = start_secure_registry(tmp_path_factory.mktemp("token-registry"), f"pw-{uuid.uuid4().hex}", bearer=True)
    yield registry
    registry.stop()


class LoginWorkspace(Workspace):
    """A Workspace publishing to the secure registry, with the Docker config `docker login` would have written."""

    def __init__(self, root: Path, registry, real_rows: bool = False):
        super().__init__(root, registry.host, real_rows)
        self.secure = registry
        self.outputs: list[str] = []  # everything the CLI printed, to look for credentials in

    def cli(self, *args: str, check_exit: int | None = None, env: dict | None = None):
        result = run_cli("--matrix", str(self.matrix), "--images", str(self.images), "--reports", str(self.reports),
                         *args, check_exit=check_exit, env=env or self.secure.env())
        self.outputs += [result.stdout, result.stderr]
        return result

    def publish(self, *selectors: str, date: str = "20260101", check_exit: int | None = 0, extra=()):
        return super().publish(*selectors, date=date, check_exit=check_exit,
                               extra=("--certs-d", str(self.secure.certs_d), *extra))

    def digest_of(self, tag: str) -> str | None:
        status, headers, _ = self.secure.request("HEAD", f"/v2/{self.namespace}/pytorch/manifests/{tag}",
                                                 {"Accept": MANIFEST_V2})
        return headers.get("Docker-Content-Digest") if status == 200 else None

    def tags(self) -> list[str]:
        status, _, body = self.secure.request("GET", f"/v2/{self.namespace}/pytorch/tags/list")
        return sorted(json.loads(body)["tags"] or []) if status == 200 else []

    def written_files(self) -> list[Path]:
        return [path for folder in (self.reports, self.catalog, self.images) if folder.exists()
                for path in folder.rglob("*") if path.is_file()]


@pytest.fixture
def space(tmp_path, secure_registry, docker_client):
    workspace = LoginWorkspace(tmp_path, secure_registry)
    yield workspace
    clean_up(workspace, docker_client)


def clean_up(workspace: LoginWorkspace, docker_client) -> None:
    """Delete what the test published and its local images; put the right login back."""
    workspace.secure.write_login(workspace.secure.password)
    for digest in {workspace.digest_of(tag) for tag in workspace.tags()} - {None}:
        workspace.secure.request("DELETE", f"/v2/{workspace.namespace}/pytorch/manifests/{digest}")
    for spec in workspace.specs.values():
        if _present(docker_client, local_name(spec)):
            docker_client.api.remove_image(local_name(spec), force=True)


def secrets_of(registry) -> list[str]:
    """The password, and the base64 `auth` value config.json holds."""
    return [registry.password, json.loads((registry.docker_config / "config.json").read_text())["auths"][registry.host]["auth"]]


def assert_no_credentials(space: LoginWorkspace) -> None:
    """Not in anything the CLI printed or wrote, nor in the config (labels, env, history) of any published image."""
    secrets = secrets_of(space.secure)
    for text in space.outputs:
        assert not any(secret in text for secret in secrets)
    for path in space.written_files():
        content = path.read_bytes()
        assert not any(secret.encode() in content for secret in secrets), path
    repository = f"/v2/{space.namespace}/pytorch"
    for digest in {space.digest_of(tag) for tag in space.tags()} - {None}:
        _, _, manifest = space.secure.request("GET", f"{repository}/manifests/{digest}", {"Accept": MANIFEST_V2})
        _, _, config = space.secure.request("GET", f"{repository}/blobs/{json.loads(manifest)['config']['digest']}")
        assert config.startswith(b"{") and not any(secret.encode() in config for secret in secrets)


# ------------------------------------------------------------------------------------------------------- publish

def test_publish_over_tls_with_a_docker_login_moves_floating_tags_by_digest_and_prunes(space, docker_client):
    ids = {tag: space.build_verified(docker_client, tag) for tag in (RUNTIME, DEVEL)}
    first = space.publish(CPU_SELECTOR, date="20260101")
    assert first.stdout.count("published") >= 2
    catalog = space.catalog_json()["images"]
    for tag, entry in catalog.items():
        names = [f"{tag}-20260101", tag] + (["latest"] if tag == RUNTIME else [])
        assert {name: space.digest_of(name) for name in names} == dict.fromkeys(names, entry["digest"])
        assert entry["platform"] == "linux/amd64"
        assert entry["verified_on"]["host"] == "cpu-only" and entry["verified_on"]["gpu_models"] == []
        assert "identity" in entry["verified_on"]["ran"] and entry["verified_on"]["skipped"] == ["gpu"]

    # Pulled back with the same login, by pinned tag and by digest, the bits are the verified image's.
    login = {"username": USER, "password": space.secure.password}
    entry = catalog[RUNTIME]
    for reference in (f"{space.repository}:{RUNTIME}-20260101", f"{space.repository}@{entry['digest']}"):
        docker_client.api.remove_image(ids[RUNTIME], force=True)
        pulled = docker_client.images.pull(reference, auth_config=login)
        assert pulled.id == ids[RUNTIME] and f"{space.repository}@{entry['digest']}" in pulled.attrs["RepoDigests"]

    # A new verified image of the row: a new pinned tag, the floating tag and alias move to its digest.
    space.build_verified(docker_client, RUNTIME)
    second = space.publish(RUNTIME, date="20260102")
    moved = space.catalog_json()["images"][RUNTIME]
    assert moved["digest"] != entry["digest"] and f"tags written: {RUNTIME}-20260102, {RUNTIME}, latest" in second.stdout
    assert space.digest_of(RUNTIME) == space.digest_of("latest") == space.digest_of(f"{RUNTIME}-20260102") == moved["digest"]
    assert space.digest_of(f"{RUNTIME}-20260101") == entry["digest"]  # pinned tags never move

    space.cli("prune", RUNTIME, "--registry", space.repository, "--retention", "1", "--catalog", str(space.catalog),
              "--certs-d", str(space.secure.certs_d), check_exit=0)
    assert space.digest_of(f"{RUNTIME}-20260101") is None and space.digest_of(entry["digest"]) is None
    assert [p["tag"] for p in space.catalog_json()["images"][RUNTIME]["pinned"]] == [f"{RUNTIME}-20260102"]
    space.cli("catalog", "--check-registry", "--catalog", str(space.catalog), "--certs-d", str(space.secure.certs_d),
              check_exit=0)
    assert_no_credentials(space)


def test_a_wrong_password_publishes_nothing_says_so_and_leaves_the_catalog_byte_identical(space, docker_client):
    space.build_verified(docker_client, RUNTIME)
    space.publish(RUNTIME, date="20260101")
    catalog_before = (space.catalog / "catalog.json").read_bytes()
    tags_before = space.tags()
    space.build_verified(docker_client, RUNTIME)
    space.build_verified(docker_client, DEVEL)

    space.secure.write_login("not-the-password")
    wrong = space.publish(CPU_SELECTOR, date="20260102", check_exit=1, extra=("--retries", "1"))
    assert "nothing published" in wrong.stdout and "refused or is missing" in wrong.stdout
    assert "docker login" in wrong.stdout and "Traceback" not in wrong.stderr
    assert "retrying" not in wrong.stderr  # a refused login is not worth another try
    assert (space.catalog / "catalog.json").read_bytes() == catalog_before and space.tags() == tags_before
    pruning = space.cli("prune", RUNTIME, "--registry", space.repository, "--retention", "1", "--catalog",
                        str(space.catalog), "--certs-d", str(space.secure.certs_d), check_exit=1)
    assert "refused or is missing" in pruning.stderr and "nothing pruned" in pruning.stderr
    assert space.tags() == tags_before
    assert "not-the-password" not in wrong.stdout + wrong.stderr + pruning.stderr
    assert_no_credentials(space)


def test_publish_to_a_registry_that_hands_out_bearer_tokens(tmp_path, token_registry, docker_client):
    space = LoginWorkspace(tmp_path, token_registry)
    try:
        image_id = space.build_verified(docker_client, RUNTIME)
        space.publish(RUNTIME)
        digest = space.catalog_json()["images"][RUNTIME]["digest"]
        assert space.digest_of(RUNTIME) == space.digest_of("latest") == space.digest_of(f"{RUNTIME}-20260101") == digest
        docker_client.api.remove_image(image_id, force=True)
        pulled = docker_client.images.pull(f"{space.repository}@{digest}",
                                           auth_config={"username": USER, "password": token_registry.password})
        assert pulled.id == image_id
        token_registry.write_login("not-the-password")
        refused = space.cli("catalog", "--check-registry", "--catalog", str(space.catalog), "--certs-d",
                            str(token_registry.certs_d), check_exit=1)
        assert "refused or is missing" in refused.stderr
        assert_no_credentials(space)
    finally:
        clean_up(space, docker_client)


def test_the_ca_is_trusted_from_certs_d_or_a_flag_and_a_wrong_ca_is_refused(space, docker_client, tmp_path):
    space.build_verified(docker_client, RUNTIME)
    empty_certs_d = tmp_path / "no-certs"
    empty_certs_d.mkdir()
    by_flag = ("--certs-d", str(empty_certs_d), "--registry-ca", str(space.secure.ca_file))
    space.publish(RUNTIME, extra=by_flag)

    other_ca, _, _ = make_certificates(tmp_path / "other-ca")
    refused = space.publish(RUNTIME, check_exit=1, extra=("--certs-d", str(empty_certs_d), "--registry-ca", str(other_ca)))
    assert "certificate signed by unknown authority" in refused.stdout and "--registry-ca FILE" in refused.stdout
    missing = space.publish(RUNTIME, check_exit=2, extra=("--registry-ca", str(tmp_path / "nope.crt")))
    assert "--registry-ca" in missing.stderr and "cannot read it (No such file or directory)" in missing.stderr and "Traceback" not in missing.stderr


def test_credentials_from_a_credential_helper_and_a_creds_store(space, docker_client, tmp_path):
    """`docker login` with a credential store leaves `auths: {HOST: {}}` and `credsStore`; credHelpers name one per host."""
    space.build_verified(docker_client, RUNTIME)
    space.publish(RUNTIME)
    helper_dir = tmp_path / "bin"
    helper_dir.mkdir()
    helper = helper_dir / "docker-credential-torchtest"
    helper.write_text(f'#!/bin/sh\nread server\nprintf \'{{"ServerURL":"%s","Username":"{USER}","Secret":"%s"}}\' '
                      f'"$server" "$TORCHTEST_SECRET"\n')
    helper.chmod(0o755)
    env = {**space.secure.env(), "PATH": f"{helper_dir}{os.pathsep}{os.environ['PATH']}",
           "TORCHTEST_SECRET": space.secure.password}
    config = space.secure.docker_config / "config.json"
    check = ("catalog", "--check-registry", "--catalog", str(space.catalog), "--certs-d", str(space.secure.certs_d))
    for document in ({"auths": {space.secure.host: {}}, "credsStore": "torchtest"},
                     {"credHelpers": {space.secure.host: "torchtest"}}):
        config.write_text(json.dumps(document))
        assert "all match" in space.cli(*check, env=env, check_exit=0).stdout
    config.write_text("{")
    damaged = space.cli(*check, env=env, check_exit=2)
    assert f"{config}:1" in damaged.stderr and "docker login" in damaged.stderr


def test_lock_resolves_a_base_on_the_login_registry_by_digest(space, docker_client):
    base = f"{space.secure.host}/{space.namespace}/base:bookworm"
    registry, tag = image_registry(base)
    access = registry_access(registry, config_dir=space.secure.docker_config, certs_d=space.secure.certs_d)
    client = RegistryClient(registry, access, RetryPolicy(retries=0), print)
    digest = client.push(docker_client.images.get("debian:bookworm").id, tag, os.environ["DOCKER_HOST"])
    locked = Resolver(docker_client, pull=False, access=lambda r: registry_access(
        r, config_dir=space.secure.docker_config, certs_d=space.secure.certs_d)).resolve(base)
    assert locked.digest == digest and locked.source == "registry"
    status, headers, _ = space.secure.request("HEAD", f"/v2/{space.namespace}/base/manifests/bookworm", {"Accept": MANIFEST_V2})
    assert status == 200 and headers["Docker-Content-Digest"] == digest
    client.delete(digest)


# ------------------------------------------------------------------------------------------------- pure pieces

def test_messages_never_show_the_docker_configs_secrets():
    access = RegistryAccess(None, None, True, secrets=Secrets.of("czNjcmV0", "s3cret-pw"))
    said = 'Get "https://u:s3cret-pw@host/v2/": auth czNjcmV0 refused; Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.x.y'
    redacted = access.redact(said)
    assert "s3cret-pw" not in redacted and "czNjcmV0" not in redacted and "eyJhbGci" not in redacted


def test_plain_http_only_for_loopback_without_a_ca_or_when_asked(tmp_path):
    certs_d = tmp_path / "certs.d"
    (certs_d / "127.0.0.1:5443").mkdir(parents=True)
    flags = {name: registry_access(image_registry(f"{name}/x/y:1")[0], config_dir=tmp_path, certs_d=certs_d).tls_verify
             for name in ("127.0.0.1:5000", "localhost:5000", "127.0.0.1:5443", "registry.example.com")}
    assert flags == {"127.0.0.1:5000": False, "localhost:5000": False, "127.0.0.1:5443": True,
                     "registry.example.com": True}
    insecure = registry_access(image_registry("registry.example.com/x/y")[0], config_dir=tmp_path, insecure=True)
    assert not insecure.tls_verify and insecure.auth_file is None and "--no-creds" in insecure.flags()


def workflow_step(job: str, name: str) -> str:
    """The shell of one step of .github/workflows/nightly.yml, as the runner would run it."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    return next(step["run"] for step in workflow["jobs"][job]["steps"] if step.get("name") == name)


def run_step(script: str, env: dict) -> subprocess.CompletedProcess:
    """A `run:` step as GitHub runs it (bash --noprofile --norc -eo pipefail), then what it added to $GITHUB_ENV."""
    result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    for line in Path(env["GITHUB_ENV"]).read_text().splitlines():
        name, _, value = line.partition("=")
        env[name] = value
    return result


@pytest.mark.parametrize("right_password", [True, False])
def test_the_workflows_login_steps_log_a_runner_in_as_docker_would(secure_registry, tmp_path, right_password):
    """The shard job's "Trust the registry's CA" and "Log in to the registry" steps, run as written, leave a Docker
    config and a CA that torchimages' registry access uses; a wrong password fails the step without printing it."""
    password = secure_registry.password if right_password else "not-the-password"
    env = {**os.environ, "RUNNER_TEMP": str(tmp_path / "runner"), "GITHUB_ENV": str(tmp_path / "github-env"),
           "DOCKER_CONFIG": str(tmp_path / "docker"), "REGISTRY": f"{secure_registry.host}/ml/pytorch",
           "REGISTRY_USER": USER, "REGISTRY_PASSWORD": password, "REGISTRY_CA": secure_registry.ca_file.read_text()}
    (tmp_path / "runner").mkdir()
    (tmp_path / "github-env").write_text("")
    trust = run_step(workflow_step("shard", "Trust the registry's CA"), env)
    assert trust.returncode == 0, trust.stderr
    login = run_step(workflow_step("shard", "Log in to the registry"), env)
    assert password not in login.stdout + login.stderr
    if not right_password:
        assert login.returncode != 0 and "invalid username/password" in login.stderr
        assert not (tmp_path / "docker" / "config.json").exists()
        return
    assert login.returncode == 0, login.stderr
    registry = image_registry(f"{secure_registry.host}/ml/pytorch:x")[0]
    access = registry_access(registry, config_dir=tmp_path / "docker", certs_d=tmp_path / "no-certs.d",
                             ca_file=Path(env["CA_FILE"]))
    client = RegistryClient(registry, access, RetryPolicy(retries=0), lambda message: None)
    client.ping()
    assert isinstance(client.tags(), list)


# --------------------------------------------------------------------------------------------------------- nightly

@pytest.fixture
def login_rows(tmp_path, secure_registry, docker_client, wheelhouse):
    """The project's CPU rows under this test's own names, publishing to the secure registry."""
    workspace = LoginWorkspace(tmp_path, secure_registry, real_rows=True)
    workspace.cli("render", check_exit=0)
    yield workspace
    clean_up(workspace, docker_client)


def nightly(space: LoginWorkspace, wheelhouse) -> tuple[object, dict]:
    return run_nightly(space, wheelhouse, "--certs-d", str(space.secure.certs_d))


def test_nightly_on_a_wiped_engine_builds_nothing_for_published_rows(login_rows, docker_client, wheelhouse):
    """A CI runner starts with an empty engine: the catalog and the registry say the rows are published already."""
    login_rows.cli("build", CPU_SELECTOR, "--wheelhouse", str(wheelhouse), check_exit=0)
    ids = {tag: docker_client.images.get(local_name(login_rows.specs[tag])).id for tag in (RUNTIME, DEVEL)}
    for tag, image_id in ids.items():
        login_rows.verified(tag, image_id)  # what a passing `build.py test` leaves
    first, summary = nightly(login_rows, wheelhouse)
    assert first.returncode == 0, first.stdout + first.stderr
    assert sorted(p["tag"] for p in summary["published"]) == sorted(ids)
    catalog_before = (login_rows.catalog / "catalog.json").read_bytes()
    for tag, entry in json.loads(catalog_before)["images"].items():
        labels = docker_client.images.get(ids[tag]).labels
        assert entry["input_hash"] and entry["input_hash"] == labels["io.torchimages.input-hash"]

    for image_id in ids.values():  # the fresh runner: none of the rows' images (the engine's shared bases stay)
        docker_client.api.remove_image(image_id, force=True)
    started = time.monotonic()
    second, again = nightly(login_rows, wheelhouse)
    took = time.monotonic() - started
    assert second.returncode == 0, second.stdout + second.stderr
    assert again["nothing_to_do"] and again["built"] == [] and again["verified"] == [] and again["published"] == []
    assert sorted(again["unchanged"]) == sorted(ids)
    assert any("nothing was pulled, built or verified" in note for note in again["notes"])
    assert "nothing was pulled, built or verified" in second.stdout
    assert not any(_present(docker_client, local_name(spec)) for spec in login_rows.specs.values())
    assert (login_rows.catalog / "catalog.json").read_bytes() == catalog_before
    print(f"second nightly on a wiped engine: {took:.1f} s")  # for docs/benchmarks.md, never asserted
    assert_no_credentials(login_rows)


def _present(docker_client, reference: str) -> bool:
    try:
        docker_client.images.get(reference)
    except docker.errors.ImageNotFound:
        return False
    return True


@pytest.mark.parametrize("builder", BUILDERS)
def test_a_changed_row_builds_on_the_layers_of_its_last_published_image(builder, space, docker_client):
    """On an engine without the row's image, the copy of its last published image lends its layers to the build:
    pushed and pulled back by skopeo; BuildKit's from the inline cache its images carry."""
    spec = space.specs[RUNTIME]
    folder = space.images / spec.tag
    folder.mkdir(parents=True)
    dockerfile = "FROM debian:bookworm\nRUN echo {nonce} > /first\nRUN echo {step} > /second\n"
    nonce = uuid.uuid4().hex
    (folder / "Dockerfile").write_text(dockerfile.format(nonce=nonce, step="one"))
    options = BuildOptions(images_dir=space.images, reports_dir=space.reports, builder=builder)
    [first] = Builder(docker_client, options).build_all([spec])
    registry, _ = image_registry(space.repository)
    client = RegistryClient(registry, registry_access(registry, space.secure.docker_config, space.secure.certs_d),
                            RetryPolicy(retries=0), print)
    digest = client.push(first.image_id, "published", os.environ["DOCKER_HOST"])
    docker_client.api.remove_image(first.image_id, force=True)  # a fresh runner: none of its layers
    if builder == "buildkit":
        docker_client.api.prune_builds(all=True)  # nor BuildKit's cache of its steps

    client.pull(digest, cache_name(spec), os.environ["DOCKER_HOST"])
    (folder / "Dockerfile").write_text(dockerfile.format(nonce=nonce, step="two"))
    try:
        [changed] = Builder(docker_client, options).build_all([spec])
    finally:
        docker_client.api.remove_image(cache_name(spec))
    assert changed.status == "built", changed.error
    log = Path(changed.log).read_text()
    if builder == "classic":
        assert log.split(f"RUN echo {nonce}")[1].split("Step 3/3")[0].count("Using cache") == 1
    else:  # BuildKit's plain progress: `#5 [2/3] RUN echo ...`, and later `#5 CACHED`
        steps = dict(re.findall(r"^(#[0-9]+) \[[0-9]/3\] (RUN echo \S+)", log, re.MULTILINE))
        cached = set(re.findall(r"^(#[0-9]+) CACHED$", log, re.MULTILINE))
        assert sorted(steps[number] for number in cached if number in steps) == [f"RUN echo {nonce}"], log
