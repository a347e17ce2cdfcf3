"""SoftHSM2, the software PKCS#11 token the hardware-key tests sign with (Debian's `softhsm2` package).

The tests make a token of their own in a temporary folder (SOFTHSM2_CONF), so the machine's tokens are never touched.
Already installed, this costs a file check; otherwise one small `apt-get install` (as root, as `make engine` does).

    python -m devtools.softhsm     # prints the PKCS#11 module's path, installing softhsm2 when needed
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = "softhsm2"
UTILITY = "softhsm2-util"
# Debian's path for the module (cosign's examples name it), then the multiarch one it links to.
MODULE = Path("/usr/lib/softhsm/libsofthsm2.so")


def softhsm_module() -> Path | None:
    """The installed SoftHSM2 module, where its utility is installed too."""
    if shutil.which(UTILITY) is None:
        return None
    return next((module for module in (MODULE, *sorted(Path("/usr/lib").glob("*/softhsm/libsofthsm2.so")))
                 if module.is_file()), None)


def ensure_softhsm() -> Path:
    found = softhsm_module()
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError(f"{PACKAGE} is not installed, and installing it needs root: run "
                           f"`sudo apt-get install {PACKAGE}` (or `sudo make softhsm`)")
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", PACKAGE]
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, env=environment, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        # Only a stale or missing package index makes the first try fail on a healthy machine.
        subprocess.run(["apt-get", "update", "-qq"], env=environment, stdout=subprocess.DEVNULL, check=True)
        subprocess.run(install, env=environment, stdout=subprocess.DEVNULL, check=True)
    installed = softhsm_module()
    if installed is None:
        raise RuntimeError(f"{PACKAGE} was installed, but neither {UTILITY} nor {MODULE} is there")
    return installed


if __name__ == "__main__":
    try:
        print(ensure_softhsm())
    except (subprocess.CalledProcessError, RuntimeError, OSError) as error:
        print(f"softhsm: could not install it: {error}", file=sys.stderr)
        sys.exit(1)
