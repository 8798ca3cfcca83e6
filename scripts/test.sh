#!/usr/bin/env bash
# Run eagle_gate's test suite against every supported SGLang version.
#
# For each version it builds (once) a light CPU virtual environment
# .venv-<version> with the REAL SGLang of that version (see
# .ci/make-sglang-env.sh), then runs lint and pytest in it. Extra arguments go
# to pytest. Set EAGLE_GATE_VERSIONS="0.5.23" to test one version only.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=${EAGLE_GATE_VERSIONS:-"0.5.9 0.5.23"}

# Build missing environments in parallel (mostly downloads and unpacking).
pids=()
for v in $versions; do
  if [ ! -x ".venv-$v/bin/python" ] || ! ".venv-$v/bin/python" -c "import sglang, eagle_gate" 2>/dev/null; then
    echo "== building .venv-$v (SGLang $v, CPU)"
    rm -rf ".venv-$v"
    mkdir -p build
    .ci/make-sglang-env.sh "$v" ".venv-$v" > "build/env-$v.log" 2>&1 &
    pids+=("$!:$v")
  fi
done
for entry in "${pids[@]}"; do
  if ! wait "${entry%%:*}"; then
    echo "building the environment for SGLang ${entry#*:} failed; last lines:" >&2
    tail -n 40 "build/env-${entry#*:}.log" >&2
    exit 1
  fi
done

first=${versions%% *}
echo "== lint (ruff)"
".venv-$first/bin/ruff" check src tests examples ci
".venv-$first/bin/ruff" format --check src tests examples ci

# Models the end-to-end tests build (the tiny target, the trained EAGLE-3
# draft) are cached here and shared by both environments.
export EAGLE_GATE_MODEL_CACHE="${EAGLE_GATE_MODEL_CACHE:-$PWD/build/test-models}"
mkdir -p "$EAGLE_GATE_MODEL_CACHE"

status=0
for v in $versions; do
  echo "== tests against SGLang $v"
  start=$SECONDS
  ".venv-$v/bin/python" -m pytest -p no:cacheprovider -W ignore::UserWarning \
    --durations=12 "$@" || status=$?
  echo "== SGLang $v: $((SECONDS - start)) s"
done
exit $status
