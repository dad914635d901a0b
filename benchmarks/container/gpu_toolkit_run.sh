#!/usr/bin/env bash
# One real run of the trainer image's contract on the GPU machine (issue 23 item 5): the
# sagemaker-training toolkit runs train.sh (TE backend, fp8) under this project's PID-1 entry
# point, in its own PID/mount/UTS namespace, with /opt/ml laid out under a temporary root; a
# SIGTERM to PID 1 (what StopTrainingJob and a spot interruption send) must end in a checkpoint,
# and a second start must resume from it. Run from the repository root on the GPU machine,
# after TE is installed (shared/tools/TE-ON-DEVICE.md) and with ".smt" carried
# (benchmarks/container/prepare_wheels.sh makes it):
#   bash benchmarks/container/gpu_toolkit_run.sh [ENTRY]     ENTRY: project (default) or dlc
# Everything it shows goes to stdout and $OUT/gpu_toolkit_run.log (the containers' output:
# $OUT/run1.log, run2.log, reference.log). SMT=DIR: the toolkit's wheels (default .smt);
# REFERENCE=0 skips the uninterrupted reference run (default: on for the project entry point)
# whose losses the resumed run's are compared with. For a dry run of the
# plumbing on a CPU machine where the toolkit is installed already:
#   PY=.venv/bin/python SKIP_INSTALL=1 BACKEND=torch PRECISION=bf16 GRACE=30 bash ... project
set -uo pipefail
entry=${1:-project}
OUT=${OUT:-/tmp/gpu_toolkit_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_toolkit_run.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
repo=$PWD
PY=${PY:-python3} BACKEND=${BACKEND:-te} PRECISION=${PRECISION:-fp8}
site=/tmp/smt-site SMT=${SMT:-.smt}
if [ "$entry" = dlc ]; then REFERENCE=${REFERENCE:-0}; else REFERENCE=${REFERENCE:-1}; fi
if [ -z "${SKIP_INSTALL:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$SMT"/*.whl || exit 1
fi
bindir=$(dirname "$(command -v "$PY")")
export PYTHONPATH=$site PATH=$site/bin:$bindir:$PATH
"$PY" -c "import sagemaker_training; print('toolkit', sagemaker_training.__file__)" || exit 1
[ "$BACKEND" != te ] || "$PY" -c "import transformer_engine.pytorch; print('TE imports')" || exit 1
nvidia-smi -L 2>/dev/null || echo "no GPU"

root=$(mktemp -d /tmp/opt-ml-XXXX)   # the container's /opt/ml
mkdir -p "$root"/input/config "$root"/input/data "$root"/model "$root"/output/data "$root"/checkpoints "$root"/code
cp kfp_sagemaker_blackwell/trainer/train.sh "$root"/code/train.sh && mkdir -p "$root"/code/kfp_sagemaker_blackwell \
  && cp kfp_sagemaker_blackwell/__init__.py "$root"/code/kfp_sagemaker_blackwell/ \
  && cp -r kfp_sagemaker_blackwell/trainer kfp_sagemaker_blackwell/catalog "$root"/code/kfp_sagemaker_blackwell/  # as the image
cat > "$root"/input/config/hyperparameters.json <<'JSON'
{"model-preset": "tiny", "backend": "BACKEND", "precision": "PRECISION", "batch-size": "8",
 "seq-length": "256", "max-steps": "400", "log-every": "1", "checkpoint-every": "0", "warmup-steps": "5"}
JSON
sed -i "s/\"BACKEND\"/\"$BACKEND\"/; s/\"PRECISION\"/\"$PRECISION\"/" "$root"/input/config/hyperparameters.json
echo '{"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}' > "$root"/input/config/resourceconfig.json
echo '{}' > "$root"/input/config/inputdataconfig.json
printf '127.0.0.1 localhost\n127.0.0.1 algo-1\n' > "$root"/hosts
if [ "$entry" = dlc ]; then  # the DLC's PID 1: bash, no trap, `train` as a child
  pid1=(bash -m -c 'train; exit $?')
else
  pid1=("$PY" "$repo/images/trainer/entrypoint.py" train)
fi

start() {  # $1 = log name: runs the container's PID 1 in the background; sets $ns (unshare's pid)
  env -i PATH="$PATH" HOME=/root PYTHONPATH="$root/code:$site" PYTHONUNBUFFERED=1 \
    SAGEMAKER_BASE_DIR="$root" SAGEMAKER_PROGRAM=train.sh SAGEMAKER_SUBMIT_DIRECTORY="$root/code" \
    SM_CHECKPOINT_DIR="$root/checkpoints" TORCH_ELASTIC_SHUTDOWN_TIMEOUT=110 PYTHON="$PY" \
    TRAINING_JOB_NAME=gpu-toolkit-run NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" \
    unshare --pid --fork --mount-proc --mount --uts --kill-child \
    sh -c 'hostname algo-1 && mount --bind "$1" /etc/hosts && shift && cd "$0/code" && exec "$@"' \
    "$root" "$root/hosts" "${pid1[@]}" > "$OUT/$1.log" 2>&1 &
  ns=$!
}
pid1_of() { cat "/proc/$1/task/$1/children" 2>/dev/null | awk '{print $1}'; }

echo "### run 1 ($entry entry point): train until step 20, then SIGTERM to PID 1"
start run1
until grep -q "step=20 " "$OUT/run1.log" 2>/dev/null; do
  kill -0 $ns 2>/dev/null || { echo "run 1 ended early"; tail -40 "$OUT/run1.log"; exit 1; }
  sleep 0.5
done
p1=$(pid1_of $ns); echo "PID 1 of the container is $p1 here: $(tr '\0' ' ' < /proc/$p1/cmdline)"
ps -o pid,ppid,pgid,cmd --ppid "$p1" || true
t0=$(date +%s.%N); kill -TERM "$p1"
grace=${GRACE:-120}
for _ in $(seq $((grace * 10))); do kill -0 $ns 2>/dev/null || break; sleep 0.1; done
if kill -0 $ns 2>/dev/null; then echo "still running after ${grace}s: SIGKILL (as SageMaker)"; kill -KILL "$p1"; fi
wait $ns; rc=$?
echo "run 1 exited $rc, $("$PY" -c "import time; print(round(time.time() - $t0, 2))") s after SIGTERM"
grep -E '^\[(trainer\] (event|checkpoint|summary|recipe)|entrypoint\]|train.sh\])|^/bin/sh -c|death signal|closing signal' "$OUT/run1.log" | cut -c1-400
echo "### the checkpoint directory"; ls -la "$root"/checkpoints/* 2>/dev/null || echo "(no checkpoint)"

echo "### run 2: a fresh start on the same /opt/ml (as after a spot restart, checkpoints restored)"
# max-steps stays 400 (the learning-rate schedule is the interrupted run's); the trainer's
# stop-after-step ends this run and the reference 10 steps after the checkpoint (step 30 without)
ck=$(ls "$root"/checkpoints 2>/dev/null | sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
last=$(( ${ck:-20} + 10 ))
sed -i "s/\"warmup-steps\": \"5\"/\"warmup-steps\": \"5\", \"stop-after-step\": \"$last\"/" "$root"/input/config/hyperparameters.json
start run2; wait $ns; echo "run 2 exited $?"
grep -E "resumed|step=$last |summary" "$OUT/run2.log" | cut -c1-400
echo "### the container's config files"; for f in "$root"/input/config/*.json; do echo "$f: $(cat "$f")"; done
[ "$REFERENCE" = 1 ] || exit 0
echo "### reference: the same steps 1-$last uninterrupted, from an empty checkpoint directory"
rm -rf "${root:?}"/checkpoints/* "$root"/model/* "$root"/output/data/*
start reference; wait $ns; echo "reference exited $?"
"$PY" - "$OUT/run1.log" "$OUT/run2.log" "$OUT/reference.log" <<'PY'
import re
import sys

def losses(path):
    text = open(path, errors="replace").read()
    return {int(s): float(v) for s, v in re.findall(r"\[trainer\] step step=(\d+) loss=(\S+)", text)}

run1, run2, ref = (losses(p) for p in sys.argv[1:])
print("step  run1       run2       reference  run2-reference")
diffs = []
for step in sorted(set(run1) | set(run2) | set(ref)):
    a, b, r = run1.get(step), run2.get(step), ref.get(step)
    if b is not None and r is not None:
        diffs.append(abs(b - r))
    if step >= min(run2, default=1) - 5:
        f = lambda x: "-" if x is None else f"{x:.6f}"
        print(f"{step:4d}  {f(a):9}  {f(b):9}  {f(r):9}  {'-' if b is None or r is None else f'{b - r:+.2e}'}")
same1 = [abs(run1[s] - ref[s]) for s in run1 if s in ref]
print(f"run1 vs reference over {len(same1)} steps: max |diff| {max(same1, default=float('nan')):.3e}")
print(f"resumed run vs reference over {len(diffs)} steps: max |diff| {max(diffs, default=float('nan')):.3e}")
PY
