#!/usr/bin/env bash
# One GPU acceptance run, prepared to fit a lent GPU's time (<= 8 minutes on one GPU):
#   1. the GPU-marked tests (CUDA against CPU: SDE log-probs, a policy forward + backward);
#   2. the calibration of FLUX.1 at its real widths on few blocks (benchmarks/gpu_calibrate.py), which writes
#      a digenrl-profile the simulator and the planner read;
#   3. the activation-memory benchmark at FLUX widths (benchmarks/gpu_memory.py);
#   4. a 3-step gap_tsp_tag run of the built-in model on CUDA, one generator and one trainer sharing the GPU
#      (Ray resources GPU 0.5 each), audited, and its observed profile simulated back (digenrl simulate).
# Every result lands in $OUT (default benchmarks/results/gpu_acceptance); a summary line per stage in
# $OUT/acceptance.json. `--tiny` runs the same stages on the CPU in about two minutes; STAGES (a comma list,
# default all) limits them (the test suite runs gpu_tests,train,simulate: the benchmarks have their own tests).
#
#   bash benchmarks/gpu_acceptance.sh            # on a GPU machine
#   bash benchmarks/gpu_acceptance.sh --tiny     # anywhere (CPU), small sizes
#
# `--device` is the bare lent machine (issue 36): python3 with torch, transformers, peft, safetensors and pytest,
# but no diffusers, pydantic or Ray, no network. It installs the wheel bundle of `scripts/device_bundle.sh`
# (carried as .whl/) into /tmp/site, runs no Ray, and runs instead:
#   1. gpu_tests: the GPU-marked CUDA parity tests (tests/models/test_cuda_parity.py);
#   2. step: benchmarks/gpu_step.py, the simulator checked against the device: DigenRL's colocated step run in
#      one process at FLUX widths (1 block unit, random weights), measured against the simulator's prediction
#      from its own calibration, and the generator pool (merged, compiled inference copy) priced on two such
#      GPUs from op costs calibrated on this one; it writes step.json;
#   3. device: benchmarks/gpu_device.py: forward against batch, forward+backward against cells per chunk
#      (1, 3, 8) with recomputation, eager against compiled, merged against unmerged LoRA, the VAE decode and
#      pinned host copies at FLUX / Qwen-Image / Wan widths with few blocks; it writes device.json and
#      profile_device*.json (the simulator reads them: sim.device_profile);
#   4. simulate_device: the simulator on that profile (digenrl simulate --config configs/flux1_dev.yaml --profile).
# Budget: each stage has a timeout (90 + 240 + 360 s). One call of the device tool runs 10 minutes at most, so a
# lent 15-minute machine takes two calls, the second at once on the still-warm machine:
#   STAGES_DEVICE=gpu_tests,step bash benchmarks/gpu_acceptance.sh --device
#   STAGES_DEVICE=device,simulate_device bash benchmarks/gpu_acceptance.sh --device
# `--device --tiny` is its CPU dry run (all four stages).
#
#   bash scripts/device_bundle.sh 3.12     # here, before the calls: the wheels to carry as .whl/
set -euo pipefail
cd "$(dirname "$0")/.."
TINY=0
DEVICE_MODE=0
for arg in "$@"; do
  case "$arg" in
    --tiny) TINY=1 ;;
    --device) DEVICE_MODE=1 ;;
    *) echo "gpu_acceptance.sh: unknown argument $arg (--tiny, --device)" >&2; exit 2 ;;
  esac
done
if [[ $DEVICE_MODE == 1 ]]; then
  PY=${PYTHON:-python3}
  WHL=${WHL:-.whl}
  if [[ -d "$WHL" ]]; then
    SITE=${SITE:-/tmp/site}
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl
    export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  else
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  fi
  DIGENRL=${DIGENRL:-"$PY -m digenrl.cli"}
else
  PY=${PYTHON:-.venv/bin/python}
  DIGENRL=${DIGENRL:-.venv/bin/digenrl}
fi
OUT=${OUT:-benchmarks/results/gpu_acceptance}
mkdir -p "$OUT"
SUMMARY="$OUT/acceptance.json"
echo "[" > "$SUMMARY.tmp"
FIRST=1
STAGES=${STAGES:-gpu_tests,calibrate,memory,train,simulate}
stage() {  # stage NAME COMMAND...: run it (if STAGES names it), time it, record its exit code
  local name=$1; shift
  [[ ",$STAGES," == *",$name,"* ]] || return 0
  local t0=$(date +%s%N) rc=0
  echo "== $name: $*" >&2
  "$@" || rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [[ $FIRST == 1 ]] || echo "," >> "$SUMMARY.tmp"
  FIRST=0
  printf '{"stage": "%s", "rc": %d, "seconds": %d.%03d}' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) >> "$SUMMARY.tmp"
  return $rc
}
finish() { echo "]" >> "$SUMMARY.tmp"; mv "$SUMMARY.tmp" "$SUMMARY"; cat "$SUMMARY"; }
trap finish EXIT

if [[ $DEVICE_MODE == 1 ]]; then
  STAGES=${STAGES_DEVICE:-gpu_tests,step,device,simulate_device}
  if [[ $TINY == 1 ]]; then
    TESTS=(env DIGENRL_PARITY_DEVICE=cpu "$PY" -m pytest -q -o addopts="" -p no:cacheprovider -m gpu tests/models/test_cuda_parity.py)
    DEV=(--tiny --repeats 1); LIMIT=600; STEP=(--tiny --steps 3 --repeats 1); STEP_LIMIT=600
  else
    TESTS=("$PY" -m pytest -q -o addopts="" -p no:cacheprovider -m gpu tests/models/test_cuda_parity.py)
    DEV=(--repeats 3); LIMIT=360; STEP=(); STEP_LIMIT=240
  fi
  FAIL=0
  stage gpu_tests timeout 90 "${TESTS[@]}" || FAIL=1
  stage step timeout "$STEP_LIMIT" "$PY" benchmarks/gpu_step.py "${STEP[@]}" --out "$OUT" || FAIL=1
  stage device timeout "$LIMIT" "$PY" benchmarks/gpu_device.py "${DEV[@]}" --out "$OUT" || FAIL=1
  simulate_device() {  # the shipped FLUX preset's step priced with the device's measured profile (one device:
    # one generator and one trainer, the pools the profile was measured with)
    $DIGENRL simulate --config configs/flux1_dev.yaml --profile "$OUT/profile_device.json" --json \
      --set runtime.generators=1 --set runtime.trainers=1 --set steps=2 --modes gap_tsp gap_tsp_tag \
      > "$OUT/simulate_device.json"
  }
  stage simulate_device simulate_device || FAIL=1
  exit $FAIL
fi

if [[ $TINY == 1 ]]; then
  DEVICE=cpu; SHARE=(); CAL=(--tiny --repeats 1); MEM=(--tiny)
  TESTS=(env DIGENRL_PARITY_DEVICE=cpu "$PY" -m pytest -q -m gpu tests/models/test_cuda_parity.py)
else
  DEVICE=cuda; SHARE=("runtime.generator_resources={GPU: 0.5}" "runtime.trainer_resources={GPU: 0.5}")
  CAL=(--layers 1 2 --repeats 3); MEM=()
  TESTS=("$PY" -m pytest -q -m gpu tests)
fi

stage gpu_tests "${TESTS[@]}"
stage calibrate "$PY" benchmarks/gpu_calibrate.py "${CAL[@]}" --out "$OUT/calibrate.json" --profile "$OUT/profile_flux1.json"
stage memory "$PY" benchmarks/gpu_memory.py "${MEM[@]}" --out "$OUT/memory.json"
stage train "$DIGENRL" train --overwrite run_dir="$OUT/run" model.device=$DEVICE runtime.mode=gap_tsp_tag steps=3 \
  runtime.generators=1 runtime.trainers=1 train.prompts_per_step=2 train.generations=4 runtime.fragment_size=2 \
  eval.every=0 eval.num_prompts=4 eval.grid_prompts=4 log.progress=false "${SHARE[@]}"
simulate_back() {  # the run's plan priced from its own observed profile, as JSON rows
  "$DIGENRL" simulate --config "$OUT/run/config.yaml" --profile "$OUT/run/profile_observed.json" \
    --json --modes gap_tsp gap_tsp_tag > "$OUT/simulate.json"
}
stage simulate simulate_back
if [[ ",$STAGES," == *",train,"* ]]; then
  "$PY" - "$OUT/run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s.get("audit_violations", []) == [], s["audit_violations"]
print("train run: audit clean, version", s.get("version"), "samples/s", s.get("samples_per_s"))
PY
fi
