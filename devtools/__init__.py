"""Development and CI tooling, not shipped in the torchimages package: the private Docker engine, registry and base
images that `make engine`, `make test` and `make images` start on a bare machine."""
