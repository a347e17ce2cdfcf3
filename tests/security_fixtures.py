"""A security archive laid out as Debian's (dists/<suite>/InRelease signed with a throwaway key, Packages.xz, pool/
with real .deb files holding changelog.Debian.gz), served from 127.0.0.1: the security tests need no network. And
what those tests share (test_security, test_hostile_security_archive, test_patch_promise): a row's check against an
archive, the fixture project with its CPU row published, and a nightly over it."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import subprocess
import tarfile
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from torchimages.project import DEFAULT_TEMPLATES
from torchimages.publish.catalog import Catalog, CatalogEntry, PinnedTag
from torchimages.publish.catalog_page import save
from torchimages.security import freshness as security
from torchimages.security.sbom import Inventory, cyclonedx

from .conftest import copy_fixture_project

SUITE = "bookworm-security"
OPENSSL_CHANGELOG = """openssl (3.0.22-1~deb12u2) bookworm-security; urgency=medium

  * Fix CVE-2026-28387 and CVE-2026-31789.

 -- Debian Security Team <team@security.debian.org>  Fri, 03 Apr 2026 10:00:00 +0000

openssl (3.0.21-1~deb12u1) bookworm-security; urgency=medium

  * New upstream release: CVE-2026-7383.

 -- Debian Security Team <team@security.debian.org>  Mon, 02 Feb 2026 10:00:00 +0000

openssl (3.0.19-1~deb12u1) bookworm-security; urgency=medium

  * Fix CVE-2025-0001 (already in the installed version).

 -- Debian Security Team <team@security.debian.org>  Thu, 01 Jan 2026 10:00:00 +0000
"""


@dataclass(frozen=True)
class Key:
    home: Path
    keyring: Path


def make_key(folder: Path, name: str) -> Key:
    """A throwaway signing key (ed25519, no passphrase) and a keyring holding its public half, as gpgv reads one."""
    home = folder / f"gnupg-{name}"
    home.mkdir(mode=0o700, parents=True)
    _gpg(home, "--quick-gen-key", f"{name} <{name}@example.invalid>", "ed25519", "sign", "never")
    keyring = folder / f"{name}.gpg"
    keyring.write_bytes(_gpg(home, "--export"))
    return Key(home, keyring)


def clearsign(key: Key, text: str) -> bytes:
    return _gpg(key.home, "--clearsign", stdin=text.encode())


def _gpg(home: Path, *arguments: str, stdin: bytes | None = None) -> bytes:
    """gpg's output. gpg starts an agent for the home folder that outlives it: stopped here, so that no test leaves
    one running."""
    try:
        return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--quiet", "--pinentry-mode", "loopback",
                               "--passphrase", "", *arguments], input=stdin, check=True, capture_output=True).stdout
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True)
        _wait_for_no_agent(home)


def _wait_for_no_agent(home: Path, timeout_s: float = 10.0) -> None:
    """`gpgconf --kill` only asks the agent to stop: it may still be exiting when gpgconf returns (seen in CI)."""
    deadline = time.monotonic() + timeout_s
    while agents_of(home) and time.monotonic() < deadline:
        time.sleep(0.05)


def agents_of(home: Path) -> list[bytes]:
    """The command lines of the gpg-agents running for this home folder."""
    return [command for command in map(_command_line, Path("/proc").glob("[0-9]*/cmdline"))
            if b"gpg-agent" in command and str(home).encode() in command]


def _command_line(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended meanwhile
        return b""


def ar(members: dict[str, bytes]) -> bytes:
    """An ar archive, as dpkg-deb writes a .deb."""
    out = bytearray(b"!<arch>\n")
    for name, data in members.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    return bytes(out)


def tar_xz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_deb(package: str, changelog: str, version: str = "0", arch: str = "amd64") -> bytes:
    control = f"Package: {package}\nVersion: {version}\nArchitecture: {arch}\nDescription: test\n".encode()
    return ar({"debian-binary": b"2.0\n", "control.tar.xz": tar_xz({"./control": control}),
               "data.tar.xz": tar_xz({f"./usr/share/doc/{package}/changelog.Debian.gz":
                                      gzip.compress(changelog.encode(), mtime=0)})})


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    arch: str = "amd64"
    changelog: str = ""  # the .deb is written into pool/ with it, when given


ARCHITECTURES = ("amd64", "arm64")  # as bookworm-security has them: a Grace row's image is judged by its own index


def write_archive(root: Path, key: Key | None, packages: list[Package], packages_xz: bytes | None = None,
                  release_packages_xz: bytes | None = None) -> Path:
    """A saved security archive below root, one index per machine. packages_xz replaces the index files served (a
    damaged one); release_packages_xz is what the Release file hashes (by default what is served)."""
    folder = root / "dists" / SUITE
    release = f"Origin: Debian\nCodename: {SUITE}\nComponents: updates/main\nSHA256:\n"
    for arch in ARCHITECTURES:
        good = _packages_index(root, [package for package in packages if package.arch in (arch, "all")])
        served = good if packages_xz is None else packages_xz
        hashed = served if release_packages_xz is None else release_packages_xz
        (folder / "main" / f"binary-{arch}").mkdir(parents=True, exist_ok=True)
        (folder / "main" / f"binary-{arch}" / "Packages.xz").write_bytes(served)
        release += f" {hashlib.sha256(hashed).hexdigest()} {len(hashed)} main/binary-{arch}/Packages.xz\n"
    (folder / "InRelease").write_bytes(clearsign(key, release) if key else release.encode())
    return root


def pool_path(package: Package) -> str:
    """Where the archive keeps a package's .deb (below its root), as the Packages index names it."""
    return f"pool/updates/main/{package.name[0]}/{package.name}/{package.name}_{package.version}_{package.arch}.deb"


def _packages_index(root: Path, packages: list[Package]) -> bytes:
    """Packages.xz listing packages, each .deb written into pool/ when it has a changelog."""
    paragraphs = []
    for package in packages:
        filename = pool_path(package)
        deb = make_deb(package.name, package.changelog or "no changelog")
        if package.changelog:
            (root / filename).parent.mkdir(parents=True, exist_ok=True)
            (root / filename).write_bytes(deb)
        paragraphs.append(f"Package: {package.name}\nVersion: {package.version}\nArchitecture: {package.arch}\n"
                          f"Filename: {filename}\nSize: {len(deb)}\nSHA256: {hashlib.sha256(deb).hexdigest()}\n")
    return lzma.compress("\n".join(paragraphs).encode(), format=lzma.FORMAT_XZ)


class _Handler(SimpleHTTPRequestHandler):
    drips = False

    def do_GET(self):
        if not self.drips:
            return super().do_GET()
        # A server that answers at once, then sends a byte at a time, each well within any read timeout.
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 30))
        self.end_headers()
        with suppress(OSError):  # the client gave up
            for _ in range(600):  # 60 s at most, then it stops short: the test cannot hang when the deadline fails
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)
        return None

    def log_message(self, *args):
        pass


@contextmanager
def serve(root: Path, drips: bool = False):
    """root over HTTP on 127.0.0.1 (or, dripping, an endless body a byte at a time for every path); yields its URL."""
    handler = type("Handler", (_Handler,), {"drips": drips})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


INSTALLED = [security.Installed("libssl3", "3.0.19-1~deb12u1", "amd64"),
             security.Installed("base-files", "12.4+deb12u5", "amd64"),
             security.Installed("tzdata", "2025b-0+deb12u1", "all")]
ROOT_TEMPLATES = DEFAULT_TEMPLATES


def compat_for(url: str, keyring: str = "") -> dict:
    return {"os": {"debian12": {"family": "apt", "security": {"url": url, "suite": SUITE, "components": ["main"],
                                                              "keyring": keyring}}},
            "families": {"apt": {"security": {"index": "deb"}}}}


def check(url: str, keyring: str = "", installed=INSTALLED, **fetcher) -> security.RowSecurity:
    factory = (lambda root: security.Fetcher(root, **fetcher)) if fetcher else security.Fetcher
    return security.Checker(compat_for(url, keyring), "compat.yaml", fetcher_factory=factory).check(
        "2.13.0-cpu-runtime", "debian12", installed)


def published_project(tmp_path, url: str, keyring: str, debs) -> list[str]:
    """The fixture project with a security archive for debian12 and its CPU row in the catalog; the CLI's options."""
    matrix = copy_fixture_project(tmp_path / "project")
    compat = matrix.with_name("compat.yaml")
    text = compat.read_text()
    old = '  debian12: {python: "3.11", image: "debian:bookworm", glibc: "2.36", family: apt}'
    assert old in text
    compat.write_text(text.replace(old, old[:-1] + f', security: {{url: "{url}", suite: {SUITE}, '
                                                   f'components: [main], keyring: "{keyring}"}}}}')
                      .replace("  apt:\n", "  apt:\n    security: {index: deb}\n", 1))
    tag, catalog = "2.13.0-cpu-runtime", tmp_path / "catalog"
    sbom = f"sbom/{tag}-20261120.cdx.json"
    (catalog / "sbom").mkdir(parents=True)
    digest = "sha256:" + "d" * 64
    (catalog / sbom).write_text(json.dumps(cyclonedx(Inventory({"ID": "debian", "VERSION_ID": "12"}, debs, []),
                                                     "registry.example.com/ml/pytorch", digest, "i", "t")))
    entry = CatalogEntry(tag, "registry.example.com/ml/pytorch", digest, "sha256:" + "c" * 64,
                         [PinnedTag(f"{tag}-20261120", digest, "2026-11-20", sbom)], [tag], {}, 1, 1, {}, {}, sbom,
                         "2026-11-20T00:00:00Z", "2026-11-20T00:00:00Z")
    save(Catalog({tag: entry}), catalog, tmp_path / "images")
    return ["--matrix", str(matrix), "--images", str(tmp_path / "images"), "--reports", str(tmp_path / "reports"),
            "security", tag, "--catalog", str(catalog)]


def nightly_for(tmp_path, url: str, keyring: str, debs):
    """A nightly over the fixture project whose CPU row is published with an SBOM listing debs (no engine needed
    for the decision: the catalog's SBOM against the security index)."""
    from torchimages.build.builder import BuildOptions
    from torchimages.matrix.load import load_compat
    from torchimages.nightly.run import Nightly, NightlyOptions
    from torchimages.peers.registry_access import registry_access
    from torchimages.peers.registry_address import parse_registry
    from torchimages.project import Project
    from torchimages.publish.catalog import load_catalog
    from torchimages.publish.publisher import PublishOptions

    args = published_project(tmp_path, url, keyring, debs)
    matrix, catalog = tmp_path / "project" / "matrix.yaml", tmp_path / "catalog"
    project = Project(matrix, matrix.with_name("compat.yaml"), ROOT_TEMPLATES, tmp_path / "images", tmp_path / "reports")
    registry = parse_registry("127.0.0.1:9/ml/pytorch")
    checker = security.Checker(load_compat(project.compat), str(project.compat))
    publishing = PublishOptions(registry, registry_access(registry, config_dir=tmp_path), project.reports, catalog,
                                project.images, "20261125", security=checker)
    options = NightlyOptions(BuildOptions(project.images, project.reports), publishing, retention=2)
    loaded = project.load()
    specs = [spec for spec in loaded.specs if spec.tag == args[7]]
    return Nightly(project, loaded, specs, options, None, lambda line: None), specs, load_catalog(catalog / "catalog.json")
