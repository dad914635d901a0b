#!/usr/bin/env bash
# One GPU session for issues 41 (the torch boundaries' rest), 40 (the small-step table, qinit again)
# and 36 item 2 / 40 item 1 (the profiles), 2026-12-07: resumable across device calls. Session v7
# (benchmarks/session_v7.sh) measured the fsdp.py memory and the TE boundaries; this one does
# what it had no time for, in the issues' order for device time.
# Run from the repository root:
#   bash benchmarks/session_v8.sh bg            # the torch-backend boundaries' rest (issue 41) in the
#                                               # background, while TransformerEngine is carried and built
#   bash benchmarks/session_v8.sh te SECONDS    # the TE block, resumable: waits for the background
#                                               # boundaries (one job on the GPU while timing), then issue
#                                               # 40's 1b b4 s4096 pair and levers (qinit again), the
#                                               # profiles (issue 40 item 1 at 1b b4 s4096; issue 36 item 2
#                                               # at 8b L4 b1 s2048, a grid family), the table's rest
#   bash benchmarks/session_v8.sh torch SECONDS # no TE (a lease too short to build it): the torch-backend
#                                               # boundaries in the foreground, then the torch backend's
#                                               # profiles of the same steps (resumable)
#   bash benchmarks/session_v8.sh dry           # every step's --dry-run on the CPU
# Every call bundles the state (/root/s8: every JSON, log and gzipped trace) into $OUT/session_v8.tgz.
set -uo pipefail
stage=${1:?stage: bg, te or dry}
total=${2:-540}
SESSION=session_v8 OUT=${OUT:-/tmp/s8_out} S=${S8_STATE:-/root/s8}
# Issue 41's held-out torch boundary shapes that session v7 did not finish (its 1b s8192 ckpt is
# complete in benchmarks/memory/boundary_h100_v7_torch.json): none of them is a shape of session
# v6's boundaries (the expandable reserve's fit). The trainer's default allocator (expandable
# segments); the planner's answer runs three times in all (--repeat 3).
# Session v8's first H100 lease (2026-12-07, 06:01) decided 8b L4 and 3b L6; 14b L6 is left.
TORCH_BOUNDARY=${TORCH_BOUNDARY:-"14b:6/4096/no-ckpt/bf16"}
# The profiles: issue 40 item 1 (the 1b step of the bar) and issue 36 item 2 (a 2k-token fp8 step
# on a 4096-wide model, 8b L4 b1 s2048, in the grid family of cal-w4096 b4 s2048, and a 4k-token
# step of 14b L3, val-14b-L3-b1-s4096 itself: steps where the parameters' costs dominate), so what is read
# from it can be checked on the held-out 1-2k-token families, 8b L4 s1024 among them).
PROFILE_SHAPES=${PROFILE_SHAPES:-"1b:4:4096,8b:1:2048:4,14b:1:4096:3"}
PROFILE_TORCH_SHAPES=${PROFILE_TORCH_SHAPES:-"8b:1:2048:4,14b:1:4096:3,1b:4:4096"}
source "$(dirname "$0")/session_common.sh"

case $stage in
  bg)
    start_background_boundaries
    ;;
  te)
    te_ready
    wait_background
    small_steps 300   # the first 9 runs: 1b b4 s4096 bf16 and fp8, and each lever on it (prefetch, qinit again)
    step profile 300 bash -c "python3 benchmarks/trainer/profile_step.py --shapes $PROFILE_SHAPES \
      --precisions bf16,fp8 --iters 4 --time-budget \$BUDGET --out-dir $S"
    torch_boundaries 300
    small_steps 900
    say "te: call ends; done: $(cd $S && ls *.done 2>/dev/null | tr '\n' ' ')"
    bundle
    ;;
  torch)  # no TransformerEngine (too little device time left to carry and build it): the
           # torch-backend boundaries in the foreground, then the bundle
    [ -f $S/torch.machine ] || { machine; touch $S/torch.machine; }
    # PROFILE_FIRST=1 (a lease too short for every boundary): the profiles first, then the
    # boundaries with what is left
    [ "${PROFILE_FIRST:-0}" = 1 ] && torch_profiles
    torch_boundaries $(( total - 20 ))
    torch_profiles
    say "torch: call ends; done: $(cd $S && ls *.done 2>/dev/null | tr '\n' ' ')"
    bundle
    ;;
  dry)
    $LFL --dry-run | awk '{print $1, $2, $3}' | tail -3
    python3 benchmarks/trainer/profile_step.py --shapes $PROFILE_SHAPES --precisions bf16,fp8 --dry-run | cut -c1-60
    python3 benchmarks/trainer/profile_step.py --backend torch --shapes $PROFILE_TORCH_SHAPES --precisions bf16 --dry-run | cut -c1-60
    python3 benchmarks/trainer/profile_step.py --backend torch --shapes $PROFILE_TORCH_SHAPES --precisions bf16 \
      --trainer-flags=--data-prefetch --dry-run | cut -c1-70
    python3 benchmarks/memory/boundary.py --dry-run --backend torch --configs "$TORCH_BOUNDARY" --gpu-memory-bytes $MEM_BYTES | tail -4
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
