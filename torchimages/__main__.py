"""`python -m torchimages`: the `torchimages` command."""
import sys

from .cli import main

if __name__ == "__main__":  # importing the module (as tools that walk the package do) runs nothing
    sys.exit(main())
