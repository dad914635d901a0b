#!/usr/bin/env bash
# The measurement calls of one session on the lent H200 (one GPU, TE installed per
# shared/tools/TE-ON-DEVICE.md), run from the repository root:
#   bash benchmarks/h200_session.sh throughput SECONDS   # the trainer's throughput grid (issue 13)
#   bash benchmarks/h200_session.sh fsdp1 SECONDS        # fsdp.py memory grid (issue 18), then what is left
#   bash benchmarks/h200_session.sh last SECONDS         # whatever is still missing
#   bash benchmarks/h200_session.sh extras SECONDS       # FP8 attention on fsdp.py, TE linear timings
# Each stage stops starting work SECONDS after it began (minus a margin), writes its results to
# $OUT after every configuration, and keeps state in /root/h200_state so that a later call on the
# same warm machine resumes instead of repeating. At most 8 files come back from $OUT: each stage
# writes 7 or fewer. Needs .baselines/fsdp.py (TE's
# examples/pytorch/fsdp/fsdp.py) and .baselines/fsdp_dropout0.py (its get_layer_args with
# hidden_dropout=0.0 and attention_dropout=0.0), carried: they are not in the repository.
set -uo pipefail
stage=${1:?stage: throughput, fsdp1 or last}
total=${2:?seconds this call may run}
end=$(( $(date +%s) + total ))
left() { echo $(( end - $(date +%s) - ${1:-0} )); }
B=$(cd "$(dirname "$0")" && pwd)  # this benchmarks/ folder (a carried copy works too)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/h200_out}
S=/root/h200_state
mkdir -p "$OUT" "$S"
FSDP=.baselines/fsdp.py
FSDP0=.baselines/fsdp_dropout0.py

throughput() {  # $1 = seconds for it; results: $S/tp.json (every call's, merged), copied to $OUT
  local budget=$1 prev=""
  [ -f $S/tp.json ] && cp $S/tp.json $S/tp_prev.json && prev="--resume $S/tp_prev.json"
  [ "$budget" -gt 20 ] || return 0
  python3 $B/throughput/measure.py --split all --out $S/tp.json --out $OUT/h200_throughput_grid.json \
    --time-budget "$budget" $prev 2>&1 | tee -a $OUT/throughput.log
}

fsdp1() {  # $1 = seconds; results: $S/fsdp1.json (merged over calls), copied to $OUT
  local budget=$1 prev=""
  [ -f $S/fsdp1.json ] && cp $S/fsdp1.json $S/fsdp1_prev.json && prev="--resume $S/fsdp1_prev.json"
  [ "$budget" -gt 30 ] || return 0
  python3 $B/memory/measure_fsdp1.py --script $FSDP --out $S/fsdp1.json --out $OUT/fsdp1_h200_grid.json \
    --raw-log $OUT/fsdp1_raw.log --time-budget "$budget" --grace 45 $prev 2>&1 | grep -v "^\[" | tee -a $OUT/fsdp1.log
}

fp8_dpa() {  # issue 16's FP8 attention lever on fsdp.py dropout 0: te-fsdp-example, batch 8, seq 8192, no checkpointing
  [ -f $S/fp8_dpa.done ] && return 0
  [ "$(left)" -gt 90 ] || { echo "fp8_dpa: not enough time left"; return 0; }
  for r in none fp8-dpa fp8-dpa-mha; do
    echo "### fsdp_dropout0.py -k 24 -b 8 -s 8192 -n 16 -d 128 -i 8 --precision fp8 recipe=$r" | tee -a $OUT/fp8_dpa.log
    RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29$((RANDOM % 400 + 100)) timeout $(( $(left) < 100 ? $(left) : 100 )) \
      python3 $B/memory/measure_fsdp1.py --child --recipe $r --warmup 2 -- $FSDP0 \
      -k 24 -b 8 -s 8192 -n 16 -d 128 -i 8 --precision fp8 2>&1 \
      | grep -E "FSDP1_CHILD|Avg. Iter|Peak Memory|Error|error|Warning" | cut -c1-1500 | tee -a $OUT/fp8_dpa.log
  done
  touch $S/fp8_dpa.done
}

gemms() {
  [ -f $S/gemms.done ] && return 0
  [ "$(left)" -gt 40 ] || { echo "gemms: not enough time left"; return 0; }
  python3 $B/throughput/gemms.py --out $OUT/h200_gemms.json --time-budget "$(left 20)" --reps 10 2>&1 \
    | tail -3 && touch $S/gemms.done
}

case $stage in
  throughput)
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv
    throughput "$(left 45)"
    ;;
  fsdp1)
    fsdp1 "$(left 150)"
    throughput "$(left 60)"
    fp8_dpa
    gemms
    ;;
  extras)  # only the optional measurements (a fresh machine: no earlier state)
    fp8_dpa
    gemms
    ;;
  last)
    throughput "$(left 120)"
    fsdp1 "$(left 60)"
    fp8_dpa
    gemms
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
ls -la "$OUT"
