"""sigstore-js's verifier (@sigstore/verify) for the signing tests: a second, independent reading of the project's
Sigstore bundles beside cosign's (devtools/verify_bundle.mjs runs it).

The packages are pinned in devtools/sigstore-js/package.json and its committed package-lock.json, and installed with
`npm ci --ignore-scripts` into devtools/sigstore-js/node_modules (git-ignored): the lockfile's versions and integrity
hashes exactly, and no package's install script runs. Node.js and npm come from the machine (Debian's `nodejs` and
`npm`); where there is no node the tests that need it skip, saying so.

    python -m devtools.sigstore_js              # prints the verifier script's path, installing the packages if needed
    python -m devtools.sigstore_js --optional   # the same, but a machine without node is told so and exits 0
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

DEVTOOLS = Path(__file__).resolve().parent
PACKAGES = DEVTOOLS / "sigstore-js"
LOCKFILE = PACKAGES / "package-lock.json"
NODE_MODULES = PACKAGES / "node_modules"
SCRIPT = DEVTOOLS / "verify_bundle.mjs"
# @sigstore/verify 3.1's floor (its package.json's engines): 4.x needs node 22, Debian 13 ships node 20.
NODE_FLOOR = (20, 17)


class NodeMissing(RuntimeError):
    """No usable node (or npm) on this machine: not an install failure, a machine without the tool."""


def node_path() -> Path | None:
    """The node on PATH when it is new enough for the pinned packages."""
    node = shutil.which("node")
    if node is None:
        return None
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=True).stdout
        major, minor = (int(part) for part in version.strip().lstrip("v").split(".")[:2])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return Path(node) if (major, minor) >= NODE_FLOOR else None


def installed() -> bool:
    """Whether node_modules holds every package of the lockfile at the lockfile's version (what `npm ci` leaves)."""
    locked = json.loads(LOCKFILE.read_text())["packages"]
    for location, entry in locked.items():
        if not location:  # "" is this folder's own package
            continue
        try:
            version = json.loads((PACKAGES / location / "package.json").read_text()).get("version")
        except (OSError, ValueError):
            return False
        if version != entry.get("version"):
            return False
    return True


def sigstore_js_script() -> Path | None:
    """The verifier script, when node runs it here and its packages are installed; else None."""
    return SCRIPT if node_path() and installed() else None


def ensure_sigstore_js() -> Path:
    """The verifier script, its packages installed from the lockfile first when they are not."""
    if node_path() is None:
        raise NodeMissing(f"no node {'.'.join(map(str, NODE_FLOOR))} or newer on PATH (Debian: apt-get install nodejs)")
    if installed():
        return SCRIPT
    npm = shutil.which("npm")
    if npm is None:
        raise NodeMissing("node is here but npm is not (Debian: apt-get install npm)")
    subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"], cwd=PACKAGES,
                   check=True, stdout=subprocess.DEVNULL)
    if not installed():
        raise RuntimeError(f"`npm ci` ran in {PACKAGES} but node_modules does not match package-lock.json")
    return SCRIPT


if __name__ == "__main__":
    optional = "--optional" in sys.argv[1:]
    try:
        print(ensure_sigstore_js())
    except NodeMissing as missing:
        print(f"sigstore-js: not installed: {missing}; the tests that need it skip", file=sys.stderr)
        sys.exit(0 if optional else 1)
    except (subprocess.CalledProcessError, RuntimeError, OSError, ValueError) as error:
        print(f"sigstore-js: could not install it: {error}", file=sys.stderr)
        sys.exit(1)
