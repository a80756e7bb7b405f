#!/usr/bin/env bash
# One device call: smoke check, sanitizers, GPU tests, benchmark. Logs under $OUT.
set -u
export FERRUM_MARLIN_LIBRARY=${FERRUM_MARLIN_LIBRARY:-$PWD/build/sm90/libferrum_marlin.so}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
steps=${STEPS:-"check sanitize tests bench"}
for step in $steps; do
  case $step in
    check) timeout 120 python scripts/check_w4a16.py 2>&1 | tee "$OUT/check.log" | tail -40 ;;
    sanitize)
      timeout 180 compute-sanitizer --tool memcheck --error-exitcode 3 python scripts/check_w4a16.py --small > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -3 "$OUT/memcheck.log"
      timeout 180 compute-sanitizer --tool racecheck --error-exitcode 3 python scripts/check_w4a16.py --small > "$OUT/racecheck.log" 2>&1; echo "racecheck rc=$?"; tail -3 "$OUT/racecheck.log" ;;
    tests) timeout 300 python -m pytest -q -m gpu tests/ 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15 ;;
    bench) timeout 300 python scripts/bench.py ${BENCH_ARGS:-} --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -25 ;;
  esac
done
