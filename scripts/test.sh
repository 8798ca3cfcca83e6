#!/usr/bin/env bash
# Run eagle_gate's test suite against every supported SGLang version.
#
# For each version it builds (once) a light CPU virtual environment
# .venv-<version> with the REAL SGLang of that version (see
# .ci/make-sglang-env.sh), then runs lint and pytest in it. Extra arguments go
# to pytest. Set EAGLE_GATE_VERSIONS="0.5.23" to test one version only.
#
# --fast: lint and the unit tier only (tests/unit marked unit by
# tests/conftest.py: no SGLang in the test process, no model, no server),
# tests marked `slow` left out, in the first version's environment only (the
# unit tier imports no SGLang, so a second environment tests nothing new);
# under 2 minutes on 2 cores. Without it: every tier (unit, inprocess,
# servers), the unit tier once (see SPEC_MODULES below).
set -euo pipefail
cd "$(dirname "$0")/.."
versions=${EAGLE_GATE_VERSIONS:-"0.5.9 0.5.23"}

fast=0
pytest_args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then fast=1; else pytest_args+=("$arg"); fi
done
if [ "$fast" = 1 ]; then
  set -- tests/unit -m "unit and not slow" ${pytest_args[@]+"${pytest_args[@]}"}
else
  set -- ${pytest_args[@]+"${pytest_args[@]}"}
fi
# the fast tier keeps its logs apart from a full run's
log_tag=$([ "$fast" = 1 ] && echo "fast-" || true)

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
[ "$fast" = 1 ] && versions=$first
echo "== lint (ruff)"
".venv-$first/bin/ruff" check src tests examples ci
".venv-$first/bin/ruff" format --check src tests examples ci

# Models the end-to-end tests build (the tiny target, the trained EAGLE-3
# draft) are cached here and shared by both environments.
export EAGLE_GATE_MODEL_CACHE="${EAGLE_GATE_MODEL_CACHE:-$PWD/build/test-models}"
mkdir -p "$EAGLE_GATE_MODEL_CACHE"

# A CI run: tests whose dependencies the CI environments carry fail, not skip,
# when one is missing (tests/inprocess/test_trained_draft.py).
export EAGLE_GATE_CI=1

# One pytest session: pytest in version $1's environment, label $2 (its log
# and temp-directory name). Its own --basetemp keeps sessions running side by
# side out of each other's temp directories.
run_suite() {
  local v=$1 label=$2; shift 2
  local start=$SECONDS
  local rc=0
  ".venv-$v/bin/python" -u -m pytest -p no:cacheprovider -W ignore::UserWarning \
    --basetemp "${TMPDIR:-/tmp}/eagle-gate-pytest-$label-$$" --durations=40 "$@" || rc=$?
  echo "== SGLang $v [$label]: $((SECONDS - start)) s, pytest exit $rc"
  return $rc
}

# The sessions: one per version, or, for a whole run (no pytest arguments),
# two per version (EAGLE_GATE_SHARDS=0: one): the speculative-server modules
# (test_spec_e2e.py, test_mtp_e2e.py: about half of a version's time) and
# everything else. Most of a session's time is one process at a time (a Python
# server stepping a tiny model, a client waiting for it), about 0.65 of a
# core on average on a 2-core machine, so two sessions per version keep both
# cores busy where one per version left a third of them idle. Each session
# gets one OpenMP thread per process, so servers do not spin against each
# other's threads; its output streams with a "[label]" prefix and is kept
# whole in build/test-<label>.log. EAGLE_GATE_PARALLEL=0 runs the versions one
# after the other, unsharded.
# The DP-replica and PD-decode modules (about 3 min per version) join the
# speculative-server session: CI (stop 37) had that one 6-7 min shorter.
# The GLM MoE module (MTP, about 2.5 min per version) too: at stop 41 0.5.23's
# rest session ran 2,569 s, its spec session 2,340 s (0.5.9: 2,260, 1,795).
# The unit tier imports no SGLang: it runs once, in the first version's spec
# session (the shortest: at stop 42 0.5.9 spec 2,545 s, the others
# 2,788-3,169), not in every session (about 85 s of a core each).
# test_pd_decode.py (about 100 s) went back to the rest sessions: in a run of
# 2026-12-07 the 0.5.23 spec session ran 3,873 s, its rest session 3,680.
# With the attention stand-ins (2026-12-07) a full run here took 0.5.9 spec
# 1,154 s, rest 1,641, 0.5.23 spec 1,546, rest 1,884: test_validate_script.py
# (216 s and 142 s) joins the spec sessions.
SPEC_MODULES=(tests/servers/test_spec_e2e.py tests/servers/test_mtp_e2e.py
  tests/servers/test_dp_replicas.py tests/servers/test_depths_e2e.py
  tests/servers/test_glm_moe_e2e.py tests/servers/test_validate_script.py)
UNIT_TIER=tests/unit
shard=0
if [ "$fast" = 0 ] && [ "$#" = 0 ] && [ "${EAGLE_GATE_SHARDS:-1}" != 0 ]; then
  shard=1
fi
mkdir -p build
n_versions=$(echo $versions | wc -w)
status=0
if [ "$n_versions" -gt 1 ] && [ "${EAGLE_GATE_PARALLEL:-1}" != 0 ]; then
  if [ "$fast" = 0 ]; then
    echo "== building the shared test models once (cached in $EAGLE_GATE_MODEL_CACHE)"
    PYTHONPATH=tests ".venv-$first/bin/python" -m support.model_cache "$EAGLE_GATE_MODEL_CACHE"
  fi
  labels=()
  pids=()
  start_session() {
    local v=$1 label=$2; shift 2
    echo "== tests against SGLang $v [$label] (side by side; log build/test-$label.log)"
    (
      set -o pipefail
      OMP_NUM_THREADS=1 run_suite "$v" "$label" "$@" 2>&1 | tee "build/test-$label.log" | sed -u "s/^/[$label] /"
    ) &
    pids+=("$!")
    labels+=("$label")
  }
  for v in $versions; do
    if [ "$shard" = 1 ]; then
      unit=()
      [ "$v" = "$first" ] && unit=("$UNIT_TIER")
      start_session "$v" "$v-spec" "${SPEC_MODULES[@]}" ${unit[@]+"${unit[@]}"}
      ignores=("--ignore=$UNIT_TIER")
      for m in "${SPEC_MODULES[@]}"; do ignores+=("--ignore=$m"); done
      start_session "$v" "$v-rest" "${ignores[@]}"
    else
      start_session "$v" "$log_tag$v" "$@"
    fi
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
  done
  for label in "${labels[@]}"; do
    grep -E "^(=+ .*(passed|failed|error).* =+|== SGLang )" "build/test-$label.log" | sed "s/^/[$label] /" || true
  done
else
  for v in $versions; do
    echo "== tests against SGLang $v"
    run_suite "$v" "$log_tag$v" "$@" || status=$?
  done
fi
[ "$fast" = 1 ] && echo "== fast tier: $SECONDS s in all"
exit $status
