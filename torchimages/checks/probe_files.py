"""The probe's files part (`probe.py --part files`, run as root): the CUDA library copies on disk, package caches and
credential files left in the image; and the CUDA libraries a process has loaded.

Standard library only: copied into the container beside probe.py (verify.container.PROBE_MODULES) and imported there as
a plain module.
"""
from __future__ import annotations

import json
import os
import re

try:
    from . import rules
except ImportError:  # a module of the probe run as a script: probe.py put its folder on sys.path
    import rules  # type: ignore[no-redef]

LIBRARY_ROOTS = ("/usr/lib", "/usr/lib64", "/usr/local", "/opt", "/lib", "/lib64")
# Headers, docs and caches hold no shared libraries; skipping them keeps the walk well under a second.
PRUNED_DIRS = {"include", "share", "doc", "man", "__pycache__", "pkgconfig", "cmake", "src", "proc", "sys"}
PASSWORD_LINE = re.compile(r"^\s*(password|token|_authToken|_auth|aws_secret_access_key|oauth_token)\s*[=:]", re.I | re.M)
HOME_CREDENTIAL_FILES = (
    ".netrc", ".pypirc", ".docker/config.json", ".config/pip/pip.conf", ".pip/pip.conf", ".git-credentials",
    ".aws/credentials", ".huggingface/token", ".cache/huggingface/token", ".config/gh/hosts.yml", ".npmrc",
)
GLOBAL_CREDENTIAL_FILES = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", "/etc/netrc")
# Files that are credentials by their mere presence; the others only when they hold a secret.
ALWAYS_SECRET = (".netrc", ".git-credentials", ".aws/credentials", ".huggingface/token", ".cache/huggingface/token", "/etc/netrc")


def loaded_libraries(maps_path: str = "/proc/self/maps") -> dict[str, list[str]]:
    """The CUDA libraries this process has mapped, by family: which copy torch really loaded."""
    paths = set()
    with open(maps_path, encoding="utf-8", errors="replace") as stream:
        for line in stream:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/"):
                paths.add(fields[5].strip())
    return rules.group_library_copies(sorted(paths), resolve=lambda path: path)


# ---------------------------------------------------------------- the files part (runs as root)

def library_files(roots=LIBRARY_ROOTS) -> list[str]:
    found: list[str] = []
    seen_roots: set[str] = set()
    for root in roots:
        real_root = os.path.realpath(root)
        if real_root in seen_roots or not os.path.isdir(real_root):
            continue
        seen_roots.add(real_root)
        for directory, subdirs, files in os.walk(real_root):
            subdirs[:] = [d for d in subdirs if d not in PRUNED_DIRS]
            found.extend(os.path.join(directory, name) for name in files
                         if name.startswith("lib") and rules.library_family(name))
    return found


def home_directories() -> list[str]:
    homes = {"/root", os.environ.get("HOME", "/root")}
    if os.path.isdir("/home"):
        homes.update(os.path.join("/home", name) for name in os.listdir("/home"))
    return sorted(h for h in homes if os.path.isdir(h))


def directory_bytes(path: str) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass
    return total


# What a package manager keeps in an empty cache or list folder (apt's lock and partial/, its auxfiles/).
EMPTY_CACHE_ENTRIES = {"lock", "partial", "auxfiles"}


def package_caches(homes: list[str], os_caches: list[str]) -> list[dict]:
    """pip's caches, and the OS family's package caches and lists (compat.yaml `families.<family>.caches`), that hold
    anything: an image should not ship them."""
    candidates = [os.path.join(home, ".cache", "pip") for home in homes]
    candidates += [p for p in (os.environ.get("PIP_CACHE_DIR"), "/var/cache/pip") if p]
    leftovers = [{"path": p, "bytes": directory_bytes(p), "kind": "pip cache"}
                 for p in sorted(set(candidates)) if os.path.isdir(p) and os.listdir(p)]
    for path in os_caches:
        entries = [n for n in os.listdir(path) if n not in EMPTY_CACHE_ENTRIES] if os.path.isdir(path) else []
        if entries:
            leftovers.append({"path": path, "bytes": directory_bytes(path), "kind": "OS package cache",
                              "files": len(entries)})
    return leftovers


def _holds_secret(path: str, content: str) -> str | None:
    if path.endswith(ALWAYS_SECRET):
        return "credential file"
    if path.endswith(".docker/config.json"):
        try:
            config = json.loads(content or "{}")
        except ValueError:
            return None
        auths = config.get("auths") or {}
        if any(isinstance(entry, dict) and (entry.get("auth") or entry.get("identitytoken")) for entry in auths.values()):
            return "registry credentials in auths"
        return None
    if rules.URL_CREDENTIALS.search(content):
        return "a URL with user:password"
    if PASSWORD_LINE.search(content):
        return "a password or token entry"
    return None


def credential_files(homes: list[str]) -> list[dict]:
    candidates = [os.path.join(home, name) for home in homes for name in HOME_CREDENTIAL_FILES]
    candidates += list(GLOBAL_CREDENTIAL_FILES)
    if os.environ.get("PIP_CONFIG_FILE"):
        candidates.append(os.environ["PIP_CONFIG_FILE"])
    found = []
    for path in sorted(set(candidates)):
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as stream:
                content = stream.read(200_000)
        except OSError as error:
            found.append({"path": path, "reason": f"unreadable even as root ({error})"})
            continue
        reason = _holds_secret(path, content)
        if reason:
            found.append({"path": path, "reason": reason})
    if os.path.isdir("/build-inputs"):
        found.append({"path": "/build-inputs", "reason": "build inputs (wheelhouse, CA bundle) left in the image"})
    return found


def files_facts(os_caches: list[str]) -> dict:
    homes = home_directories()
    return {"part": "files", "uid": os.getuid(), "homes": homes,
            "library_copies": rules.group_library_copies(library_files()),
            "package_caches": package_caches(homes, os_caches), "credential_files": credential_files(homes)}
