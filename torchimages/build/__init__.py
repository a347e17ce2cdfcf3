"""Stages 2 and 3, render and build: a Dockerfile per tag, built on the engine (classic or BuildKit), skipping
unchanged inputs; the base pins (`lock`), the wheels and .debs a build installs, and `doctor` before a long build.
The code that runs inside a build step (the build-input server, the venv layers) is `torchimages/build_inputs/`: its
bytes are an input of every row's hash, so it stays where it is."""
