#!/usr/bin/env bash
# Issue 36 (and 41's boundaries): the parts, the calibration grid and the held-out families in ONE
# session of one lent H200, so that the fit and its check share a machine and a day.
# Run from the repository root:
#   bash benchmarks/throughput/session_v6.sh bg             # torch-backend set + torch boundaries, in
#                                                            # the background (needs no TE: runs while TE installs)
#   bash benchmarks/throughput/session_v6.sh te SECONDS     # TE block, resumable: reference (start),
#                                                            # parts, grid, held-out, new held-out,
#                                                            # reference (end), TE boundaries
#   bash benchmarks/throughput/session_v6.sh dry             # the same plan on the CPU: each step's
#                                                            # --dry-run (no GPU needed)
# Every call bundles the session's state (/root/s6: every JSON, raw trainer log and step log) into
# $OUT/session_v6.tgz and copies the driver's own log to $OUT/session_v6.log.
# The session id (GPU_SESSION_ID) is written into every file's header (benchmarks/gpu_record.py).
set -uo pipefail
stage=${1:?stage: bg, te or dry}
total=${2:-540}
end=$(( $(date +%s) + total ))
left() { echo $(( end - $(date +%s) - ${1:-0} )); }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/s6_out}
S=${S6_STATE:-/root/s6}
mkdir -p "$OUT" "$S"
[ -f $S/session_id ] || echo "gpu-$(date -u +%Y%m%dT%H%M%SZ)-$RANDOM" > $S/session_id
export GPU_SESSION_ID=$(cat $S/session_id)
LOG=$S/driver.log
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a $LOG; }
# Issue 41's held-out boundary shapes (none is in boundary_h200*.json's fit): both backends, with
# and without checkpointing, under the trainer's default allocator (expandable segments).
TORCH_BOUNDARY="8b:8/4096/ckpt/bf16,3b:8/2048/no-ckpt/bf16,14b:6/4096/no-ckpt/bf16,1b/8192/ckpt/bf16"
TE_BOUNDARY="3b:8/2048/no-ckpt/fp8,8b:6/4096/ckpt/bf16,14b:6/4096/no-ckpt/bf16,1b/8192/ckpt/fp8"
# The lent GPU's memory (an H100 may come for an H200): the boundary search plans for it and the
# grids skip what the estimate puts above 90% of it.
MEM_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -d ' ')
MEM_MIB=${MEM_MIB:-143771}
MEM_BYTES=$(( MEM_MIB * 1048576 ))
MAX_GIB=$(( MEM_MIB * 9 / 10240 ))
MT=${MT:-"python3 benchmarks/throughput/measure.py --max-predicted-gib $MAX_GIB"}

bundle() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv >> $S/nvidia_smi.log 2>&1
  tar -czf "$OUT/session_v6.tgz" -C "$S" --exclude='*.tgz' --exclude=./tree . 2>/dev/null
  cp $LOG "$OUT/session_v6.log"
}

# step NAME BUDGET_CAP COMMAND...: runs COMMAND once (a marker file says done), with at most
# BUDGET_CAP seconds or what is left; the command's output goes to $S/NAME.log.
step() {
  local name=$1 cap=$2; shift 2
  if [ -f $S/$name.done ]; then say "$name: done earlier"; return 0; fi
  local b; b=$(left 20); [ "$b" -gt "$cap" ] && b=$cap
  if [ "$b" -lt 25 ]; then say "$name: not enough time left ($b s)"; return 1; fi
  say "+ $* (budget $b s)"
  BUDGET=$b timeout $(( b + 90 )) "$@" >> $S/$name.log 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && ! grep -q "time budget reached" $S/$name.log; then touch $S/$name.done; fi
  say "$name: rc $rc; $(grep -c '"status": "ok"' $S/$name.log) ok lines; last: $(tail -c 300 $S/$name.log | tail -1)"
}

# a measure.py split, resumed from its own earlier partial file
mstep() {
  local name=$1 split=$2 cap=$3 extra=${4:-}
  local prev=""; [ -f $S/$name.json ] && cp $S/$name.json $S/$name.prev.json && prev="--resume $S/$name.prev.json"
  step "$name" "$cap" bash -c "$MT --split $split --out $S/$name.json --raw-log $S/${name}_raw.log --time-budget \$BUDGET $prev $extra"
}

bg_job() {  # the torch backend's set (no TE), then its boundaries
  cd $S/tree
  export PYTHONPATH=$S/tree
  mstep torch torch 200
  step boundary_torch 150 bash -c "python3 benchmarks/memory/boundary.py --backend torch --configs '$TORCH_BOUNDARY' \
    --out $S/boundary_torch.json --gpu-memory-bytes $MEM_BYTES --time-budget \$BUDGET --run-timeout 120 $( [ -f $S/boundary_torch.json ] && echo --resume)"
}

case $stage in
  bg)
    if [ -f $S/bg.started ]; then say "bg: already started"; bundle; exit 0; fi
    nvidia-smi | tee -a $LOG
    rm -rf $S/tree && mkdir -p $S/tree
    tar --exclude=./.git --exclude=./.te -cf - . | (cd $S/tree && tar -xf -)
    touch $S/bg.started
    end=$(( $(date +%s) + ${BG_BUDGET:-480} ))
    export -f step mstep say left bg_job; export S LOG MT end TORCH_BOUNDARY MEM_BYTES
    (setsid bash -c 'bg_job; echo $? > $S/bg.rc' < /dev/null > $S/bg.out 2>&1 &)
    sleep 3; say "bg: started (session $GPU_SESSION_ID)"; bundle
    ;;
  te)
    python3 -c "import transformer_engine as t; print('transformer_engine', t.__version__)" | tee -a $LOG || exit 3
    if [ -f $S/bg.started ] && [ ! -f $S/bg.rc ]; then
      say "waiting for the background torch job (one job on the GPU at a time)"
      until [ -f $S/bg.rc ] || [ "$(left 0)" -lt 60 ]; do sleep 3; done
      [ -f $S/bg.rc ] || { say "bg still running: stopping it"; pkill -f boundary.py; pkill -f "split torch"; sleep 3; }
    fi
    mstep ref_start reference-start 60
    step parts 130 bash -c "python3 benchmarks/throughput/parts.py --out $S/parts.json --time-budget \$BUDGET"
    mstep grid all 330
    mstep heldout heldout 220
    mstep heldout2 heldout2 130
    mstep ref_end reference-end 60
    step boundary_te 240 bash -c "python3 benchmarks/memory/boundary.py --backend te --configs '$TE_BOUNDARY' \
      --out $S/boundary_te.json --gpu-memory-bytes $MEM_BYTES --time-budget \$BUDGET --run-timeout 120 $( [ -f $S/boundary_te.json ] && echo --resume)"
    say "te: calls end here; $(ls $S/*.done 2>/dev/null | wc -l) steps done"
    bundle
    ;;
  dry)
    for s in reference-start all heldout heldout2 reference-end torch; do $MT --split $s --out /dev/null --dry-run | tail -1; done
    python3 benchmarks/throughput/parts.py --out /dev/null --dry-run | tail -2
    python3 benchmarks/memory/boundary.py --dry-run --backend torch --configs "$TORCH_BOUNDARY" | tail -4
    python3 benchmarks/memory/boundary.py --dry-run --backend te --configs "$TE_BOUNDARY" | tail -4
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
