#!/usr/bin/env python3
"""The `torchimages` command from a clone: `python build.py COMMAND` works on this repository's project wherever it
is run from. See README.md."""
import sys
from pathlib import Path

from torchimages.cli import main

if __name__ == "__main__":
    sys.exit(main(start=Path(__file__).resolve().parent))
