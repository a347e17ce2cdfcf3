"""`python -m torchimages`: the `torchimages` command."""
import sys

from .cli import main

sys.exit(main())
