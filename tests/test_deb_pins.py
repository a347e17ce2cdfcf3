"""The OS packages as inputs (issue 47, item 2), without an engine: an apt step's record, a kept folder checked by
sha256, the flat repository served to a pinned build, the provenance that names the .debs and a rebuild's claim of
them. The build from pinned .debs itself is in tests/test_reproducible_build.py (a real engine and Debian mirror)."""
import hashlib
import json
import re
import urllib.error
import urllib.request

import pytest
from debian.deb822 import Packages

from torchimages.build import debs as deb_pins
from torchimages.build_inputs.server import BUILD_INPUTS_PORT, BuildInputsServer, basic_authorization
from torchimages.matrix.load import load_matrix
from torchimages.model import InputError
from torchimages.trust import attestations
from torchimages.trust.rebuild import claim_of, engine_note

from .conftest import FIXTURE_COMPAT, FIXTURE_MATRIX, copy_fixture_project, run_cli_in_process
from .security_fixtures import make_deb as deb_file

TOKEN = "d" * 48
NO_ENGINE = "unix:///nonexistent/docker.sock"


def make_deb(folder, name: str, version: str, arch: str = "amd64") -> deb_pins.PinnedDeb:
    """A real .deb (security_fixtures.make_deb), named as apt names the files it fetches."""
    body = deb_file(name, "", version, arch)
    filename = f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / filename).write_bytes(body)
    return deb_pins.PinnedDeb("python", filename, hashlib.sha256(body).hexdigest())


def kept_folder(tmp_path, tag="2.13.0-cpu-runtime") -> tuple:
    folder = tmp_path / "debs"
    pins = [make_deb(folder, "python3.11", "3.11.2-6+deb12u9"), make_deb(folder, "perl-base", "1:5.36.0-7", "amd64")]
    pins.append(deb_pins.PinnedDeb("security", pins[1].filename, pins[1].sha256))
    (folder / f"{tag}.debs.json").write_text(json.dumps({"schema": 1, "debs": [pin.to_json() for pin in pins]}))
    return folder, pins


def test_a_record_line_names_the_package_its_version_with_epoch_and_arch():
    [pin] = deb_pins.parse_record("python", f"{'a' * 64}  perl-base_1%3a5.36.0-7+deb12u1_amd64.deb\n", "record")
    assert (pin.name, pin.version, pin.arch) == ("perl-base", "1:5.36.0-7+deb12u1", "amd64")
    assert pin.purl("debian") == "pkg:deb/debian/perl-base@1:5.36.0-7+deb12u1?arch=amd64"
    for bad in (f"{'a' * 63}  x_1_amd64.deb", f"{'a' * 64}  ../etc/passwd", f"{'a' * 64}  x_1_amd64.deb extra"):
        with pytest.raises(InputError, match="record"):
            deb_pins.parse_record("python", bad, "record")


def test_a_kept_folder_is_checked_file_by_file_before_anything_is_built(tmp_path):
    folder, pins = kept_folder(tmp_path)
    assert deb_pins.load_pinned(folder, "2.13.0-cpu-runtime") == pins
    with pytest.raises(InputError, match=r"no pinned \.debs for 2\.13\.0-cpu-devel: run `torchimages debs"):
        deb_pins.load_pinned(folder, "2.13.0-cpu-devel")
    changed = folder / pins[0].filename
    changed.write_bytes(changed.read_bytes()[:-1] + bytes([changed.read_bytes()[-1] ^ 1]))  # one byte
    with pytest.raises(InputError, match=rf"{re.escape(pins[0].filename)}: sha256 [0-9a-f]{{16}}\.\.\., the record"):
        deb_pins.load_pinned(folder, "2.13.0-cpu-runtime")
    changed.unlink()
    with pytest.raises(InputError, match="missing: the python step installed it"):
        deb_pins.load_pinned(folder, "2.13.0-cpu-runtime")


def test_each_step_is_served_as_a_flat_repository_of_its_own_files_and_only_with_the_token(tmp_path):
    folder, pins = kept_folder(tmp_path)
    with deb_pins.served(folder, pins) as files, BuildInputsServer({}, "", None, TOKEN, debs=files) as server:
        base = f"http://{server.address}:{BUILD_INPUTS_PORT}/debs"

        def fetch(path: str, token: str | None = TOKEN) -> bytes:
            headers = {"Authorization": basic_authorization(token)} if token else {}
            with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=10) as answer:
                return answer.read()

        python = list(Packages.iter_paragraphs(fetch("/python/./Packages").decode(), use_apt_pkg=False))  # apt asks for ./Packages
        assert [(p["Package"], p["Version"], p["Filename"], p["SHA256"]) for p in python] == [
            ("perl-base", "1:5.36.0-7", f"./{pins[1].filename}", pins[1].sha256),
            ("python3.11", "3.11.2-6+deb12u9", f"./{pins[0].filename}", pins[0].sha256)]
        assert [p["Package"] for p in Packages.iter_paragraphs(fetch("/security/Packages").decode(), use_apt_pkg=False)] == ["perl-base"]
        assert fetch(f"/python/./{pins[0].filename}") == (folder / pins[0].filename).read_bytes()
        for path, token, code in ((f"/security/{pins[0].filename}", TOKEN, 404), ("/python/Packages", None, 401),
                                  ("/python/../../etc/passwd", TOKEN, 404)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                fetch(path, token)
            assert refused.value.code == code


def test_a_file_that_is_not_a_deb_is_refused_naming_it(tmp_path):
    folder, pins = kept_folder(tmp_path)
    (folder / pins[0].filename).write_bytes(b"not an ar archive")
    with pytest.raises(InputError, match="not a .deb apt can install"):
        deb_pins.packages_index(folder, pins[:1])


def test_the_provenance_names_each_deb_and_a_rebuild_claims_exactly_them(tmp_path):
    _, pins = kept_folder(tmp_path)
    spec = next(spec for spec in load_matrix(FIXTURE_MATRIX, FIXTURE_COMPAT).specs if spec.os == "debian12")
    image = {"Id": "sha256:" + "1" * 64, "Config": {"Labels": {"org.opencontainers.image.revision": "c" * 40}}}
    provenance = attestations.provenance_predicate(spec, image, [], None, pins)
    named = [d for d in provenance["buildDefinition"]["resolvedDependencies"] if d["uri"].startswith("pkg:deb/")]
    assert named[0] == {"uri": "pkg:deb/debian/python3.11@3.11.2-6+deb12u9?arch=amd64", "name": pins[0].filename,
                        "digest": {"sha256": pins[0].sha256}, "annotations": {"step": "python"}}
    assert claim_of(provenance, "ref").debs == pins
    named[0]["name"] = "../../etc/passwd"
    with pytest.raises(InputError, match="OS packages are not as `torchimages publish` writes them"):
        claim_of(provenance, "ref")


def test_build_with_debs_refuses_a_changed_file_in_one_line_before_the_engine(tmp_path):
    folder, pins = kept_folder(tmp_path)
    project = copy_fixture_project(tmp_path / "project").parent
    cli = lambda *args: run_cli_in_process("--project", str(project), "--reports", str(tmp_path / "reports"),  # noqa: E731
                                           *args, env={"DOCKER_HOST": NO_ENGINE})
    changed = folder / pins[0].filename
    changed.write_bytes(b"x" + changed.read_bytes()[1:])
    refused = cli("build", "2.13.0-cpu-runtime", "--debs", str(folder), "--inputs-server", "loopback")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert pins[0].filename in refused.stderr and "another file under its name" in refused.stderr
    container = cli("build", "2.13.0-cpu-runtime", "--debs", str(folder), "--inputs-server", "container")
    assert container.returncode == 2 and "--inputs-server loopback" in container.stderr
    missing = cli("build", "2.13.0-cpu-runtime", "--debs", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "build.py debs ROW --dest DIR" in missing.stderr


def test_the_provenance_names_the_engine_and_a_rebuild_across_docker_23_says_why_layers_differ(tmp_path):
    """bench/engine_versions_bench.py, 2026-11-28: Docker 20.10.24 and 26.1.5 wrote the same files of the CPU runtime
    row with other tar headers (the mode's type bits, user and group names), so every built layer differed."""
    spec = next(spec for spec in load_matrix(FIXTURE_MATRIX, FIXTURE_COMPAT).specs if spec.os == "debian12")
    image = {"Id": "sha256:" + "1" * 64, "Config": {"Labels": {"org.opencontainers.image.revision": "c" * 40}}}
    provenance = attestations.provenance_predicate(spec, image, [], None, (), "20.10.24+dfsg1")
    assert provenance["runDetails"]["builder"]["version"]["docker"] == "20.10.24+dfsg1"
    assert claim_of(provenance, "ref").engine == "20.10.24+dfsg1"
    note = engine_note("20.10.24+dfsg1", "26.1.5+dfsg1")
    assert note.startswith("note: published by Docker 20.10.24+dfsg1, rebuilt with Docker 26.1.5+dfsg1: engines")
    assert engine_note("26.1.5", "29.2.0") == engine_note("20.10.24", "20.10.5") == engine_note("", "26.1.5") == ""
    provenance["runDetails"]["builder"]["version"]["docker"] = ["not", "text"]
    assert claim_of(provenance, "ref").engine == ""
