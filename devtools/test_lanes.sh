#!/usr/bin/env bash
# `make test`: the engine-free tests first, on $TEST_WORKERS processes (pytest-xdist; 2 when unset), then the engine
# tests in one process, in order (they share built images, tags, the engine's build cache and the reports folder's
# lock, which the engine-free tests' CLI runs take too: the two lanes do not run at once). Exits non-zero if either
# lane failed.
set -uo pipefail
python=$1
shift
"$python" -m pytest -m "not engine" -n "${TEST_WORKERS:-2}" -q "$@"
engine_free_rc=$?
"$python" -m pytest -m engine --durations=15 "$@"
engine_rc=$?
exit $((engine_rc != 0 || engine_free_rc != 0))
