#!/usr/bin/env bash
# The trainer benchmark on the lent H200 machine (see README.md beside this file).
# Usage (repo root, TE installed, fsdp.py and torch_block_baseline.py in benchmarks/trainer/.ext/):
#   bash benchmarks/trainer/bench_h200.sh core|best|scaling  >> raw log
# Steady state only: baselines are timed at two iteration counts and differenced; the trainer
# skips its first --timing-warmup-steps steps in its own timer.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
EXT=benchmarks/trainer/.ext
SHAPE_TE=(-k 24 -b 16 -s 8192 -n 16 -d 128 --checkpoint-layer transformerlayer)
SHORT=2 LONG=5

te_fsdp() {  # $1 = label, rest = precision args
  local label=$1; shift
  for i in $SHORT $LONG; do
    echo "### te_fsdp $label iters=$i"
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
      $EXT/fsdp.py "${SHAPE_TE[@]}" -i "$i" "$@" 2>&1 | grep -E "Training Time|Avg. Iter|Peak Memory|Error|error" | head -8
  done
}

torch_ref() {
  for i in $SHORT $LONG; do
    echo "### torch_ref iters=$i"
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $EXT/torch_block_baseline.py -k 24 -b 16 -s 8192 --ac -i "$i" 2>&1 | tail -2
  done
}

trainer() {  # $1 = label, $2 = GPUs, rest = trainer flags
  local label=$1 gpus=$2; shift 2
  echo "### trainer $label gpus=$gpus args=$*"
  local devs=0; [ "$gpus" = 2 ] && devs=0,1
  CUDA_VISIBLE_DEVICES=$devs SM_NUM_GPUS=$gpus PYTHON=python3 MASTER_PORT=$((29500 + RANDOM % 1000)) timeout 400 \
    bash trainer/train.sh --preset te-fsdp-example --seq-length 8192 --max-steps 6 --timing-warmup-steps 2 \
    --log-every 1 --checkpoint-dir "" --model-dir "" --output-dir /tmp/bench_out --output-data-dir "" "$@" 2>&1 \
    | grep -E "\[trainer\] (step|summary|event|recipe)|Error|error" | grep -v "^\[trainer\] config" | tail -9
}

case "${1:-core}" in
  core)
    nvidia-smi -L
    torch_ref
    te_fsdp bf16 --dtype bf16 --no-fp8
    te_fsdp fp8 --precision fp8
    trainer te-bf16 1 --precision bf16 --backend te --batch-size 16 --activation-checkpointing
    trainer torch-bf16 1 --precision bf16 --backend torch --batch-size 16 --activation-checkpointing
    trainer te-fp8 1 --precision fp8 --backend te --batch-size 16 --activation-checkpointing
    ;;
  best)
    trainer te-fp8-b4-noac 1 --precision fp8 --backend te --batch-size 4 --no-activation-checkpointing
    trainer te-fp8-b8-noac 1 --precision fp8 --backend te --batch-size 8 --no-activation-checkpointing
    trainer torch-bf16-b4-noac 1 --precision bf16 --backend torch --batch-size 4 --no-activation-checkpointing
    trainer te-fp8-b32-ac 1 --precision fp8 --backend te --batch-size 32 --activation-checkpointing
    ;;
  scaling)
    trainer te-fp8-2gpu 2 --precision fp8 --backend te --batch-size 16 --activation-checkpointing
    trainer torch-bf16-2gpu 2 --precision bf16 --backend torch --batch-size 16 --activation-checkpointing
    ;;
esac
