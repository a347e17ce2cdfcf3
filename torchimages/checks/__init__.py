"""The checks `build.py test` runs against an image, shipped with the package.

probe.py runs inside the container (standard library and the image's torch only) and gathers the facts;
downstream.py builds, on the host, an image FROM the one under test that pip-installs a wheel; suite/ is the
pytest-testinfra suite that asserts on those facts, one named check per test (see torchimages.checks.plugin).
"""
