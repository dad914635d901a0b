#!/usr/bin/env bash
# Issue 26's device calls on the lent one-GPU H200, run from the repository root (or a carried
# copy of it), TE installed per shared/tools/TE-ON-DEVICE.md between the calls:
#   bash benchmarks/trainer/session_h200.sh bg          # torch-backend stall runs, in the background
#                                                       # (no TE needed: they run while TE's parts travel)
#   bash benchmarks/trainer/session_h200.sh bg-wait     # waits for them, copies their logs to $OUT
#   bash benchmarks/trainer/session_h200.sh measure SECONDS STAGES   # like_for_like.py stages
# Every log lands in $OUT; like_for_like.py keeps its state in /root/lfl_state.json, so a later
# call on the same warm machine resumes where the last one stopped.
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/h200_out}
BG=/root/bg
mkdir -p "$OUT" "$BG"
B=$(cd "$(dirname "$0")" && pwd)

torch_stall() {  # the te-fsdp-example shape on the torch backend, 30 steps, both collectors
  for gc in 0 50; do
    echo "### torch bf16 te-fsdp-example b4 s4096 --gc-every $gc"
    timeout 150 python3 -m kfp_sagemaker_blackwell.trainer --model-preset te-fsdp-example --seq-length 4096 --batch-size 4 \
      --precision bf16 --backend torch --max-steps 30 --timing-warmup-steps 3 --log-every 1 \
      --gc-every $gc --checkpoint-dir "" --model-dir "" --output-data-dir "" --output-dir /tmp/bg_out 2>&1 \
      | grep -E "\[trainer\] (step|summary|event)|Error|error|returned a view" | cut -c1-3000
  done
}

case ${1:?stage: bg, bg-wait or measure} in
  bg)
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,driver_version --format=csv \
      | tee "$OUT/machine.txt"
    python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())' | tee -a "$OUT/machine.txt"
    rm -f $BG/done
    setsid bash "$0" torch-stall < /dev/null > $BG/torch_stall.log 2>&1 &
    echo "background torch runs started"
    ;;
  torch-stall)
    torch_stall; touch $BG/done
    ;;
  bg-wait)
    for _ in $(seq 1 150); do [ -f $BG/done ] && break; sleep 2; done
    cp $BG/torch_stall.log "$OUT/" 2>/dev/null
    [ -f $BG/done ] && echo "background runs done" || echo "background runs NOT done"
    ;;
  measure)
    secs=${2:?seconds}; stages=${3:?stages}
    python3 "$B/like_for_like.py" --time-budget "$secs" --stages "$stages" \
      --out "$OUT/like_for_like_h200.json" --raw-log "$OUT/like_for_like_raw.log" 2>&1 | tee -a "$OUT/lfl.log"
    cp /root/lfl_state.json "$OUT/like_for_like_h200.json" 2>/dev/null
    python3 "$B/like_for_like.py" --table "$OUT/like_for_like_h200.json" | tee "$OUT/tables.md"
    ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
