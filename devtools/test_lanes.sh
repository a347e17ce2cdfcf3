#!/usr/bin/env bash
# `make test`: the engine (its debootstrapped bases, the registry) and cosign are set up in the background while the
# render check, the lint and the engine-free tests run, on $TEST_WORKERS processes (pytest-xdist; 2 when unset): none
# of those needs the engine, and a fresh runner's engine takes about two minutes to start. Then the engine tests, on
# two processes that each take whole modules in order (tests/conftest.py's groups: modules that share build stages,
# BuildKit's cache or local image names run on one side). The two lanes do not run at once: the engine-free tests'
# CLI runs take the repository's folders' locks too. Exits non-zero if anything failed.
set -uo pipefail
python=$1
shift
engine_log=$(mktemp)
make --no-print-directory engine cosign >"$engine_log" 2>&1 &
engine_setup=$!
trap 'rm -f "$engine_log"' EXIT
engine_setup_done() {  # waits for it (an engine half started could not be stopped), then shows its log
    wait "$engine_setup"
    local rc=$?
    cat "$engine_log"
    return $rc
}
if ! make --no-print-directory render-check lint; then
    engine_setup_done
    exit 1
fi
"$python" -m pytest -m "not engine" -n "${TEST_WORKERS:-2}" --dist loadgroup -q "$@"
engine_free_rc=$?
engine_setup_done
engine_setup_rc=$?
if [ "$engine_setup_rc" != 0 ]; then
    echo "test_lanes: the engine's set-up failed (above); the engine tests did not run" >&2
    exit 1
fi
# shellcheck source=/dev/null
source .engine/env
# A run that finds a folder held by the other process waits for it (wheels being fetched) instead of failing.
TORCHIMAGES_LOCK_WAIT=1800 "$python" -m pytest -m engine -n 2 --dist loadgroup --durations=15 "$@"
engine_rc=$?
exit $((engine_rc != 0 || engine_free_rc != 0))
