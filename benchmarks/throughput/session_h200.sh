#!/usr/bin/env bash
# Issue 25's throughput measurements on one lent H200, run from the repository root:
#   bash benchmarks/throughput/session_h200.sh bg             # torch-backend set (~80 s), in the background
#   bash benchmarks/throughput/session_h200.sh bg-wait [SECS] # wait for it (default 200 s), copy to $OUT
#   bash benchmarks/throughput/session_h200.sh te SECONDS     # parts (~80 s), then the TE held-out set (~185 s)
# `bg` needs no TransformerEngine (measure.py --split torch refuses to import it), so it can
# run while TE is still being installed: it copies the tree to /root/bg/tree first (later
# transfer calls rewrite the working tree), starts measure.py under setsid and returns at
# once. `te` waits for a running `bg` first (one job on the GPU at a time), then runs
# parts.py (once per machine) and measure.py --split heldout, resumable through
# /root/tp_state: a second `te` call on the same warm machine goes on where the first stopped.
# Every stage writes at most 8 files to $OUT. Each command line is printed as run ("+ ...").
set -uo pipefail
stage=${1:?stage: bg, bg-wait or te}
total=${2:-200}
end=$(( $(date +%s) + total ))
left() { echo $(( end - $(date +%s) - ${1:-0} )); }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/tp_out}
S=${TP_STATE:-/root/tp_state}
BG=${TP_BG:-/root/bg}
TB=${TORCH_BUDGET:-170}   # seconds of the torch set (expected about 80)
# TP_STATE, TP_BG and TORCH_SET_ARGS (default --split torch) move the state and the set for a
# check off the GPU: TORCH_SET_ARGS="--split smoke --device cpu" TP_BG=/tmp/bg ... bg
PB=${PARTS_BUDGET:-140}   # seconds of parts.py (expected about 90)
mkdir -p "$OUT" "$S" "$BG"

bg_running() { [ -f $BG/started ] && [ ! -f $BG/rc ]; }  # rc: written when the set ends

bg_copy() {  # the torch set's files, as far as they are written
  for f in torch.json torch.log torch_raw.log; do
    [ -f $BG/$f ] && cp $BG/$f "$OUT/h200_$f"
  done
  return 0
}

bg_start() {
  if [ -f $BG/started ]; then echo "bg: already started"; return 0; fi
  rm -rf $BG/tree && mkdir -p $BG/tree
  tar --exclude=./.git -cf - . | (cd $BG/tree && tar -xf -)
  touch $BG/started
  local cmd="python3 benchmarks/throughput/measure.py ${TORCH_SET_ARGS:---split torch} --out $BG/torch.json --raw-log $BG/torch_raw.log --time-budget $TB"
  echo "+ cd $BG/tree && PYTHONPATH=$BG/tree $cmd > $BG/torch.log 2>&1  # under setsid, in the background"
  local job="$cmd > $BG/torch.log 2>&1; echo \$? > $BG/rc"
  # a new session (setsid, or python's os.setsid where the tool is missing) outlives the call
  if command -v setsid > /dev/null; then
    (cd $BG/tree && PYTHONPATH=$BG/tree setsid bash -c "$job" < /dev/null > /dev/null 2>&1 &)
  else
    (cd $BG/tree && PYTHONPATH=$BG/tree python3 -c 'import os, sys; os.setsid(); os.execvp("bash", ["bash", "-c", sys.argv[1]])' \
      "$job" < /dev/null > /dev/null 2>&1 &)
  fi
  sleep 2
  echo "bg: started"; head -c 600 $BG/torch.log
}

bg_wait() {  # $1 = seconds at most
  [ -f $BG/started ] || { echo "bg: never started on this machine"; return 0; }
  local until=$(( $(date +%s) + $1 ))
  while bg_running && [ "$(date +%s)" -lt "$until" ]; do sleep 2; done
  if bg_running; then echo "bg: still running after $1 s"; else echo "bg: done, rc $(cat $BG/rc 2>/dev/null)"; fi
  tail -3 $BG/torch.log 2>/dev/null
}

parts() {  # once per machine: a timed-out run keeps what it wrote
  if [ -f $S/parts.started ]; then
    echo "parts: ran already"; cp $S/parts.json "$OUT/h200_parts.json"; cp $S/parts.log "$OUT/parts.log"; return 0
  fi
  local budget=$(( $(left 60) < PB ? $(left 60) : PB ))
  [ "$budget" -gt 30 ] || { echo "parts: not enough time left"; return 0; }
  touch $S/parts.started
  echo "+ python3 benchmarks/throughput/parts.py --out $S/parts.json --out $OUT/h200_parts.json --time-budget $budget"
  timeout $(( budget + 60 )) python3 benchmarks/throughput/parts.py --out $S/parts.json --out "$OUT/h200_parts.json" \
    --time-budget "$budget" > $S/parts.log 2>&1
  echo "parts: rc $? ($(grep -c . $S/parts.log) log lines)"; tail -2 $S/parts.log; cp $S/parts.log "$OUT/parts.log"
}

heldout() {  # the TE held-out set, resumed from this machine's earlier calls
  local budget prev=""
  budget=$(left 25)
  [ "$budget" -gt 20 ] || { echo "heldout: not enough time left"; return 0; }
  [ -f $S/ho.json ] && cp $S/ho.json $S/ho_prev.json && prev="--resume $S/ho_prev.json"
  echo "+ python3 benchmarks/throughput/measure.py --split heldout --out $S/ho.json --out $OUT/h200_heldout.json --raw-log $S/ho_raw.log --time-budget $budget $prev"
  python3 benchmarks/throughput/measure.py --split heldout --out $S/ho.json --out "$OUT/h200_heldout.json" \
    --raw-log $S/ho_raw.log --time-budget "$budget" $prev 2>&1 | tee -a $S/ho.log
  cp $S/ho.log "$OUT/heldout.log"; cp $S/ho_raw.log "$OUT/heldout_raw.log" 2>/dev/null
  return 0
}

case $stage in
  bg)
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv
    bg_start
    ;;
  bg-wait)
    bg_wait "$(left 5)"
    bg_copy
    ;;
  te)
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv
    python3 -c "import transformer_engine as t; print('transformer_engine', t.__version__)" || exit 3
    bg_running && bg_wait "$(left 300)"
    bg_copy
    parts
    heldout
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
ls -la "$OUT"
