"""hygiene: the configured user (and an arbitrary uid) works, one copy of each CUDA library, no package caches,
no credentials in files, ENV or history, size within the row's budget, the entrypoint passes arguments on."""
import re
import secrets
import shlex

import pytest

from torchimages.checks.rules import SECRET_NAME, URL_CREDENTIALS
from torchimages.model import parse_size
from torchimages.reporting import human_size

from .helpers import duplicated_libraries

pytestmark = pytest.mark.check("hygiene")

HISTORY_ASSIGNMENT = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


def test_runs_as_the_configured_user(host, main, image, spec):
    if spec.user is None:
        pytest.skip("the row configures no user")
    uid = host.user().uid  # what `docker exec` (and so `docker run`) gives users
    assert uid == spec.user.uid == main["user"]["uid"], (
        f"the image runs as uid {uid} (USER {image['user'] or 'unset, i.e. root'}), but row {spec.tag} configures "
        f"{spec.user.name} (uid {spec.user.uid}): end the Dockerfile with USER {spec.user.uid}")


def test_home_is_writable(main):
    user = main["user"]
    assert user["home_writable"], (
        f"uid {user['uid']} cannot write to HOME={user['home'] or '(unset)'} ({user['home_error']}): caches and "
        "checkpoints will fail; create it owned by the user with group 0 and g=u permissions")


def test_works_under_an_arbitrary_uid(arbitrary_user, torch_facts, expect):
    user = arbitrary_user["user"]
    problems = []
    if not arbitrary_user["torch_ok"]:
        problems.append(f"import torch fails: {arbitrary_user['torch_error']}")
    if not user["home_writable"]:
        problems.append(f"HOME={user['home']} is not writable ({user['home_error']})")
    assert not problems, (
        f"as `--user {expect['arbitrary_uid']}` (gid {user['gid']}): " + "; ".join(problems)
        + ": make HOME and caches group 0 writable (chmod g=u), as OpenShift-style platforms run arbitrary uids")


def test_one_copy_of_each_cuda_library(files, main):
    loaded = main.get("libraries_loaded") or {}
    duplicated = []
    for family, paths in duplicated_libraries(files["library_copies"]).items():
        torch_loads = ", ".join(loaded.get(family, [])) or "none of them in the probe"
        duplicated.append(f"{family}: {len(paths)} copies ({', '.join(paths)}); torch loads {torch_loads}")
    for family, paths in loaded.items():
        if len(paths) > 1:
            duplicated.append(f"{family}: torch loaded {len(paths)} copies at once ({', '.join(paths)})")
    assert not duplicated, ("CUDA libraries present more than once: " + "; ".join(duplicated)
                            + ". Keep the copy torch loads (its nvidia-* wheels) and remove the other, e.g. build "
                            "FROM the plain OS or CUDA -base image instead of -runtime/-cudnn/-devel")


def test_cpu_image_has_no_cuda_libraries(files, spec):
    if spec.is_gpu:
        pytest.skip("GPU image: CUDA libraries belong here")
    found = [path for paths in files["library_copies"].values() for path in paths]
    assert not found, (f"CPU image contains CUDA libraries ({', '.join(found)}): install torch from the cpu index and "
                       "build FROM the plain OS image")


def test_no_package_caches(files):
    leftovers = [f"{entry['kind']} {entry['path']} ({human_size(entry['bytes'])})" for entry in files["package_caches"]]
    assert not leftovers, (
        "package caches left in the image: " + "; ".join(leftovers) + ". Use pip install --no-cache-dir, and clean "
        "the OS package manager in the RUN that used it (apt: `apt-get clean && rm -rf /var/lib/apt/lists/*`; dnf: "
        "`dnf clean all`)")


def test_no_credential_files(files):
    found = [f"{entry['path']} ({entry['reason']})" for entry in files["credential_files"]]
    assert not found, (
        "credentials left in the image: " + "; ".join(found) + ". Anyone who pulls the image can read them: remove "
        "them in the same RUN that needed them, or pass them with RUN --mount=type=secret, and rotate them")


def test_no_secrets_in_the_environment(main, image):
    baked = [entry.split("=", 1)[0] for entry in image["env"]
             if "=" in entry and entry.split("=", 1)[1]
             and (SECRET_NAME.search(entry.split("=", 1)[0]) or URL_CREDENTIALS.search(entry.split("=", 1)[1]))]
    names = sorted(set(baked) | set(main["secret_env"]))
    assert not names, (
        f"the image's ENV carries secrets: {', '.join(names)} (values not shown). ENV is readable by anyone "
        "with the image (docker inspect): pass them at run time (-e / --env-file), and rotate them")


def test_no_credentials_in_the_build_history(image):
    exposed = set()
    for line in image["history"]:
        if URL_CREDENTIALS.search(line):
            exposed.add("a URL with user:password")
        exposed.update(name for name, value in HISTORY_ASSIGNMENT.findall(line) if SECRET_NAME.search(name) and value)
    assert not exposed, (
        f"the image history (docker history --no-trunc) exposes {', '.join(sorted(exposed))}: build arguments and "
        "ENV are recorded in layers; use RUN --mount=type=secret, and rotate what leaked")


def test_size_within_the_rows_budget(image, spec):
    if not spec.size_budget:
        pytest.skip("the row sets no size_budget")
    budget = parse_size(spec.size_budget)
    assert image["size"] <= budget, (
        f"the image is {human_size(image['size'])}, over row {spec.tag}'s size_budget of {spec.size_budget}: look "
        "for caches, duplicated CUDA libraries and build tools in `docker history`")


def test_entrypoint_passes_arguments_through(host, image):
    if not image["entrypoint"]:
        pytest.skip("the image has no entrypoint")
    nonce = secrets.token_hex(8)
    result = host.run(shlex.join([*image["entrypoint"], "echo", nonce]))
    assert result.rc == 0 and nonce in result.stdout, (
        f"`docker run IMAGE echo {nonce}` would not print it through the entrypoint {image['entrypoint']} "
        f"(exit {result.rc}, stderr {result.stderr.strip()[-300:]!r}): the entrypoint must end with exec \"$@\"")
