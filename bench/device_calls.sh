#!/usr/bin/env bash
# Several device_bench.sh steps in one device call, results bundled so they fit the run tool's
# limit of 8 files back (device_bench.sh alone writes more than that across steps).
#
#   bash bench/device_calls.sh OUT "STEP[:SECONDS]" ["STEP[:SECONDS]" ...]
#
# Each STEP runs with LIMIT=SECONDS (default 300) and its own output folder; after every step every
# small result (everything but the tarballs) is packed into OUT/results.tar (re-written after each
# step, so a call cut by the run tool's limit still returns what finished), and the newest
# cubin.tar.xz / tuning.tar.xz go to OUT directly (carry them back as .cubin/ and .tuning/).
# Environment for one step: put it before the script (e.g. TESTS=..., MODELS=...); it applies to all.
set -u
OUT=${1:?usage: device_calls.sh OUT STEP[:SECONDS] ...}; shift
WORK=/tmp/device_calls; mkdir -p "$WORK" "$OUT"
for spec in "$@"; do
  step=${spec%%:*}; secs=${spec#*:}; [ "$secs" = "$spec" ] && secs=300
  echo "=== device_calls: $step for at most $secs s ($(date -u +%T))"
  LIMIT=$secs bash bench/device_bench.sh "$step" "$WORK/$step"
  for t in cubin tuning; do [ -f "$WORK/$step/$t.tar.xz" ] && mv -f "$WORK/$step/$t.tar.xz" "$OUT/$t.tar.xz"; done
  tar cf "$OUT/results.tar" -C "$WORK" . 2>/dev/null
done
echo "=== device_calls: done ($(date -u +%T))"
