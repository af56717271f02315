#!/usr/bin/env bash
# Sets up (tools/setup.sh), then runs every test: the C++ tests (ctest) of a CPU build, again of a
# build with the CUDA kernels compiled in where nvcc is, and the Python tests (pytest; GPU tests
# skip where there is no GPU). Each runner runs even when one before it failed; the run ends with
# a line per runner and, alone on the last line, "total: N passed, N failed, N skipped" (the sum).
# The exit status is non-zero when the set-up failed (the run stops there), or when any runner
# failed to build, reported a failure, exited non-zero, crashed or found no tests (each of these
# counts as one failure where the runner reported none itself).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
jobs=$(nproc)

summary=()
total_passed=0 total_failed=0 total_skipped=0

# record LABEL PASSED FAILED SKIPPED SECONDS [NOTE]
record() {
  local line="$1: $2 passed, $3 failed, $4 skipped (${5} s${6:+; $6})"
  summary+=("$line")
  total_passed=$((total_passed + $2)) total_failed=$((total_failed + $3))
  total_skipped=$((total_skipped + $4))
  echo "test: $line"
}

# How a runner ended that left no counts or exited non-zero: killed by a signal, or its status.
ended() {
  if [ "$1" -gt 128 ]; then echo "CRASHED (signal $(($1 - 128)))"
  else echo "exited with status $1"; fi
}

# run_ctest LABEL BUILD_DIR CAKE_CUDA: configure and build the C++ tests there, run ctest, and
# count its summary line ("N% tests passed, M tests failed out of T", or "100% tests passed out
# of T" from CMake 4; the tests it lists as "(Skipped)" are among T - M).
run_ctest() {
  local label=$1 dir=$2 cuda=$3 start=$SECONDS rc=0 log=$2/ctest.log
  if ! { cmake -S . -B "$dir" -G Ninja -DCAKE_CUDA="$cuda" -DCAKE_BUILD_TESTS=ON >/dev/null \
         && cmake --build "$dir" -j"$jobs"; }; then
    record "$label" 0 1 0 $((SECONDS - start)) "the build failed: counted as one failure"
    return
  fi
  ctest --test-dir "$dir" -j"$jobs" --output-on-failure --no-tests=error 2>&1 | tee "$log" \
    || rc=${PIPESTATUS[0]}
  local line total failed skipped note=""
  line=$(grep -E '^[0-9]+% tests passed(, [0-9]+ tests? failed)? out of [0-9]+' "$log" | tail -1 \
         || true)
  if [[ $line =~ tests\ passed(,\ ([0-9]+)\ tests?\ failed)?\ out\ of\ ([0-9]+) ]]; then
    failed=${BASH_REMATCH[2]:-0} total=${BASH_REMATCH[3]}
    skipped=$(awk '/^The following tests did not run:/ { on = 1; next } on && /^$/ { on = 0 }
                   on && /\(Skipped\)$/ { n++ } END { print n + 0 }' "$log")
    if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
      failed=1 note="ctest $(ended "$rc"): counted as one failure"
    fi
    record "$label" $((total - failed - skipped)) "$failed" "$skipped" $((SECONDS - start)) "$note"
  else
    record "$label" 0 1 0 $((SECONDS - start)) \
      "ctest $(ended "$rc"), no summary line: counted as one failure"
  fi
}

echo "test: [1/3] C++ tests, CPU build, emulated kernels included (build/tests; ~1 minute)"
run_ctest "ctest (cpu build)" build/tests OFF

# Where nvcc is (setup.sh then builds the module with the kernels), the C++ tests once more with
# the kernels compiled in: the validation of CUDA tensors, the saved-set and workspace queries and
# the ptxas checks run only there (no GPU needed; ~1 minute to build on 2 cores). The emulated
# kernel tests above run only in the build without them.
cake_cuda=${CAKE_CUDA:-AUTO}
if [[ ${cake_cuda^^} =~ ^(OFF|0|NO|FALSE|N)$ ]]; then
  echo "test: [2/3] C++ tests with the CUDA kernels: not run (CAKE_CUDA=$cake_cuda)"
elif command -v nvcc >/dev/null || [ -n "${CUDACXX:-}" ]; then
  echo "test: [2/3] C++ tests, build with the CUDA kernels (build/cudatests; ~1 minute)"
  run_ctest "ctest (cuda build)" build/cudatests ON
else
  echo "test: [2/3] C++ tests with the CUDA kernels: not run (no nvcc)"
fi

# pytest's counts from its JUnit XML ("tests" includes the errors, e.g. in collection, counted as
# failures here); no XML (a crash), or no test in it, is a failure of the run.
echo "test: [3/3] Python tests (pytest tests/python)"
start=$SECONDS rc=0 xml=build/pytest-junit.xml
rm -f "$xml"
python -X faulthandler -m pytest -q tests/python --junitxml="$xml" || rc=$?
if [ -f "$xml" ] && counts=$(python - "$xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
n = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for suite in suites:
    for key in n:
        n[key] += int(suite.get(key, 0))
failed = n["failures"] + n["errors"]
print(max(0, n["tests"] - failed - n["skipped"]), failed, n["skipped"], n["tests"])
EOF
); then
  read -r passed failed skipped tests <<<"$counts"
  note=""
  if [ "$tests" = 0 ]; then
    failed=1 note="pytest ran no tests: counted as one failure"
  elif [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
    failed=1 note="pytest $(ended "$rc"): counted as one failure"
  fi
  record pytest "$passed" "$failed" "$skipped" $((SECONDS - start)) "$note"
else
  record pytest 0 1 0 $((SECONDS - start)) \
    "pytest $(ended "$rc"), no results: counted as one failure"
fi

echo
printf '%s\n' "${summary[@]}"
echo "total: $total_passed passed, $total_failed failed, $total_skipped skipped"
[ "$total_failed" = 0 ]
