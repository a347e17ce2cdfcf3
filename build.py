#!/usr/bin/env python3
"""Render, build, verify and publish PyTorch images from matrix.yaml. See README.md."""
import sys

from torchimages.cli import main

if __name__ == "__main__":
    sys.exit(main())
