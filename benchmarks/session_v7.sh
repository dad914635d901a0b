#!/usr/bin/env bash
# One GPU session for issues 36 (item 5 and a small-step profile), 41 and 40 (2026-12-06, third
# session): everything in the same lease, resumable across device calls. The order is the issues'
# priority for device time: the model's and the allocator's measurements first, issue 40's table last.
# Run from the repository root:
#   bash benchmarks/session_v7.sh bg            # torch-backend boundaries (issue 41) in the background,
#                                               # while TransformerEngine is carried and built (no TE needed)
#   bash benchmarks/session_v7.sh te SECONDS    # the TE block, resumable: TE's fsdp.py held-out memory
#                                               # (issue 36 item 5), the TE boundaries (issue 41), issue 40's
#                                               # 1b b4 s4096 pair and levers, the torch boundaries' rest,
#                                               # the profiles (issue 40 item 1, 36 item 2), the table's rest
#   bash benchmarks/session_v7.sh torch SECONDS # the torch-backend boundaries alone, in the foreground
#   bash benchmarks/session_v7.sh dry           # every step's --dry-run on the CPU
# Every call bundles the state (/root/s7: every JSON, log and gzipped trace) into $OUT/session_v7.tgz.
set -uo pipefail
stage=${1:?stage: bg, te or dry}
total=${2:-540}
SESSION=session_v7 OUT=${OUT:-/tmp/s7_out} S=${S7_STATE:-/root/s7}
# Issue 41's held-out boundary shapes (none in a fit), both backends, with and without
# checkpointing, the trainer's default allocator (expandable segments); the planner's answer
# runs three times in all (--repeat 3).
# None of them is a shape of session v6's H100 boundaries (the expandable reserve's fit and its check).
TORCH_BOUNDARY=${TORCH_BOUNDARY:-"1b/8192/ckpt/bf16,8b:4/2048/no-ckpt/bf16,3b:6/4096/ckpt/bf16,14b:6/4096/no-ckpt/bf16"}
TE_BOUNDARY=${TE_BOUNDARY:-"1b/8192/ckpt/fp8,8b:4/2048/no-ckpt/fp8,3b:6/4096/ckpt/bf16,14b:4/8192/ckpt/bf16"}
source "$(dirname "$0")/session_common.sh"
BUDGET_GIB=$(( MEM_MIB * 85 / 102400 ))   # fsdp.py packing: 85% of the GPU

case $stage in
  bg)
    start_background_boundaries
    ;;
  te)
    te_ready
    if [ -f $S/bg.started ] && [ ! -f $S/bg.rc ]; then  # one job on the GPU at a time: timings first
      say "stopping the background torch boundaries (resumed at the end)"
      pkill -f "boundary.py --backend torch"; pkill -f "boundary.py --one"  # the run in flight too
      for _ in $(seq 20); do pgrep -f "boundary.py" > /dev/null || break; sleep 1; done
    fi
    step fsdp1 220 bash -c "python3 benchmarks/memory/measure_fsdp1.py --script .baselines/fsdp.py --split heldout \
      --out $S/fsdp1_heldout.json --raw-log $S/fsdp1_raw.log --log-dir $S/fsdp1_logs --gpu-budget-gib $BUDGET_GIB \
      --time-budget \$(( BUDGET - 40 )) --grace 35 $( [ -f $S/fsdp1_heldout.json ] && echo --resume $S/fsdp1_heldout.json)"
    step boundary_te 330 bash -c "python3 benchmarks/memory/boundary.py --backend te --configs '$TE_BOUNDARY' \
      --out $S/boundary_te.json --gpu-memory-bytes $MEM_BYTES --time-budget \$BUDGET --run-timeout 150 --repeat 3 \
      $( [ -f $S/boundary_te.json ] && echo --resume)"
    small_steps 250   # the first 7 runs: 1b b4 s4096 bf16 and fp8, and each lever on it
    torch_boundaries 300
    step profile 200 bash -c "python3 benchmarks/trainer/profile_step.py --shapes 1b:4:4096,8b:1:1024:4 \
      --precisions bf16,fp8 --iters 4 --time-budget \$BUDGET --out-dir $S"
    small_steps 900
    say "te: call ends; done: $(cd $S && ls *.done 2>/dev/null | tr '\n' ' ')"
    bundle
    ;;
  torch)  # no TransformerEngine (too little device time left to carry and build it): the
           # torch-backend boundaries in the foreground, then the bundle
    [ -f $S/torch.machine ] || { machine; touch $S/torch.machine; }
    torch_boundaries $(( total - 20 ))
    say "torch: call ends; done: $(cd $S && ls *.done 2>/dev/null | tr '\n' ' ')"
    bundle
    ;;
  dry)
    $LFL --dry-run | awk '{print $1, $2, $3}' | tail -3
    python3 benchmarks/trainer/profile_step.py --shapes 1b:4:4096,8b:1:1024:4 --precisions bf16,fp8 --dry-run | cut -c1-60
    python3 benchmarks/memory/measure_fsdp1.py --script .baselines/fsdp.py --split heldout --out /dev/null --dry-run | tail -2
    python3 benchmarks/memory/boundary.py --dry-run --backend torch --configs "$TORCH_BOUNDARY" --gpu-memory-bytes $MEM_BYTES | tail -4
    python3 benchmarks/memory/boundary.py --dry-run --backend te --configs "$TE_BOUNDARY" --gpu-memory-bytes $MEM_BYTES | tail -4
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
