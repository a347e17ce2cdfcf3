#!/usr/bin/env python3
"""The `torchimages` command from a clone: `python build.py COMMAND` works on this repository's project wherever it
is run from; its messages name it as `python build.py`. See README.md."""
import sys
from pathlib import Path

from torchimages.cli import main
from torchimages.invocation import CLONE

if __name__ == "__main__":
    sys.exit(main(start=Path(__file__).resolve().parent, program=CLONE))
