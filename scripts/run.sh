#!/usr/bin/env bash
# run.sh: what `make run` runs. Starts the payment provider sandbox and every service, and stops both cleanly on
# Ctrl-C or SIGTERM (each gets SIGTERM and shuts down gracefully). Exit status: 0 when they stopped because we
# were asked to and shut down cleanly, otherwise the status of the process that ended first or failed.
set -uo pipefail
bin="${RETRYSAFE_BIN:-./bin/retrysafe}"
pids=()
requested=0

stop() {
  trap '' INT TERM
  kill -TERM "${pids[@]}" 2>/dev/null || true
}
trap 'requested=1; stop' INT TERM

PROVIDER_FAULT_INJECTION="${PROVIDER_FAULT_INJECTION:-true}" "$bin" provider &
pids+=($!)
"$bin" serve all &
pids+=($!)

# Wait for the first to end (or for a signal), then stop the other.
wait -n "${pids[@]}"
first=$?
[ "$requested" -eq 1 ] || stop
status=0
for pid in "${pids[@]}"; do
  wait "$pid"
  s=$?
  [ "$s" -ne 0 ] && [ "$s" -ne 127 ] && status=$s
done
if [ "$requested" -eq 1 ] && [ "$status" -eq 0 ]; then
  # wait -n returns >128 when a trapped signal interrupted it; the children still stopped cleanly.
  echo "run.sh: stopped" >&2
  exit 0
fi
[ "$status" -eq 0 ] && status=$first
exit "$status"
