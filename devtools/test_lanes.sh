#!/usr/bin/env bash
# `make test`: the engine-free tests run in a process of their own beside the engine tests, which stay in one process,
# in order (they share built images, tags and the engine's build cache). Exits non-zero if either lane failed.
set -uo pipefail
python=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$python" -m pytest -m "not engine" -q "$@" >"$log" 2>&1 &
engine_free=$!
"$python" -m pytest -m engine --durations=15 "$@"
engine_rc=$?
wait "$engine_free"
engine_free_rc=$?
echo "---- the engine-free tests, run beside the engine tests ----"
tail -n 25 "$log"
exit $((engine_rc != 0 || engine_free_rc != 0))
