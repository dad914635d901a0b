#!/usr/bin/env bash
# The trainer benchmark on the lent H200 machine (see README.md beside this file).
# Usage (repo root, TE installed, fsdp.py and torch_block_baseline.py in benchmarks/trainer/.ext/):
#   bash benchmarks/trainer/bench_h200.sh verify|core|best|scaling [GPU]   >> raw log
# Steady state only, every run in one process: the baselines run under steady_timer.py (a global
# optimizer-step hook that synchronises and timestamps every iteration); the trainer skips its
# first --timing-warmup-steps steps in its own timer. Both leave out the first 2 of 8 iterations.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
HERE=benchmarks/trainer
EXT=$HERE/.ext
GPU=${2:-0}            # the GPU of 1-GPU runs (core and best can run side by side on GPUs 0 and 1)
ITERS=8 WARMUP=2
B=16 S=8192            # TE fsdp.py's block shape at the size: 24 x (hidden 2048, 16 heads, FFN 6144)
FLOPS=10.875e9         # model FLOPs per token of those blocks (6N + attention), as the trainer counts them
TIMER=($HERE/steady_timer.py --warmup $WARMUP --tokens-per-iter $((B * S)) --flops-per-token $FLOPS --peak-tflops 989)

te_fsdp() {  # $1 = label, $2 = GPUs, rest = fsdp.py precision args
  local label=$1 gpus=$2; shift 2
  local devs=$GPU; [ "$gpus" = 2 ] && devs=0,1
  echo "### te_fsdp $label gpus=$gpus"
  CUDA_VISIBLE_DEVICES=$devs timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node "$gpus" \
    "${TIMER[@]}" -- $EXT/fsdp.py -k 24 -b $B -s $S -n 16 -d 128 --checkpoint-layer transformerlayer -i $ITERS "$@" 2>&1 \
    | grep -E "steady_timer|Avg. Iter|Peak Memory|Error|error" | head -8
}

torch_ref() {
  echo "### torch_ref bf16 gpus=1"
  CUDA_VISIBLE_DEVICES=$GPU timeout 300 python3 "${TIMER[@]}" -- $EXT/torch_block_baseline.py -k 24 -b $B -s $S --ac -i $ITERS 2>&1 | tail -2
}

trainer() {  # $1 = label, $2 = GPUs, rest = trainer flags
  local label=$1 gpus=$2; shift 2
  echo "### trainer $label gpus=$gpus args=$*"
  local devs=$GPU; [ "$gpus" = 2 ] && devs=0,1
  CUDA_VISIBLE_DEVICES=$devs SM_NUM_GPUS=$gpus PYTHON=python3 MASTER_PORT=$((29500 + GPU * 100 + RANDOM % 100)) timeout 300 \
    bash trainer/train.sh --model-preset te-fsdp-example --seq-length $S --max-steps $ITERS --timing-warmup-steps $WARMUP \
    --log-every 1 --checkpoint-dir "" --model-dir "" --output-dir /tmp/bench_out_$GPU --output-data-dir "" "$@" 2>&1 \
    | grep -E "\[trainer\] (step|summary|event|recipe)|Error|error" | grep -v "^\[trainer\] config" | tail -4
}

small() {  # a short run of a small model on one GPU: $1 = label, rest = trainer flags
  local label=$1; shift
  echo "### $label args=$*"
  CUDA_VISIBLE_DEVICES=$GPU timeout 180 python3 -m kfp_sagemaker_blackwell.trainer --log-every 1 --model-dir "" --output-data-dir "" \
    --output-dir /tmp/o_small "$@" 2>&1 | grep -E "\[trainer\] (step|checkpoint|event)|Error" | cut -c1-200 | tail -8
}

case "${1:-core}" in
  verify)  # checkpoint resume on TE (bf16 and fp8) and activation checkpointing on the torch backend
    nvidia-smi -L
    r=(--model-preset small --seq-length 256 --checkpoint-every 3)
    for p in bf16 fp8; do
      small "te-$p-uninterrupted" "${r[@]}" --precision $p --backend te --max-steps 6 --checkpoint-dir ""
      rm -rf /tmp/ck_$p
      small "te-$p-first-half" "${r[@]}" --precision $p --backend te --max-steps 3 --checkpoint-dir /tmp/ck_$p
      small "te-$p-resumed" "${r[@]}" --precision $p --backend te --max-steps 6 --checkpoint-dir /tmp/ck_$p
    done
    small torch-bf16-ac-1b --model-preset 1b --num-layers 4 --seq-length 2048 --batch-size 2 --max-steps 3 \
      --precision bf16 --backend torch --activation-checkpointing --checkpoint-dir ""
    small torch-bf16-ac-te-fsdp-example --model-preset te-fsdp-example --num-layers 4 --seq-length 2048 --batch-size 2 \
      --max-steps 3 --precision bf16 --backend torch --activation-checkpointing --checkpoint-dir ""
    ;;
  core)
    nvidia-smi -L
    torch_ref
    te_fsdp bf16 1 --dtype bf16 --no-fp8
    te_fsdp fp8 1 --precision fp8
    trainer te-bf16 1 --precision bf16 --backend te --batch-size $B --activation-checkpointing
    trainer te-fp8 1 --precision fp8 --backend te --batch-size $B --activation-checkpointing
    trainer torch-bf16 1 --precision bf16 --backend torch --batch-size $B --activation-checkpointing
    ;;
  best)  # batch sizes from the memory estimate: without checkpointing, batch 8 fits (90-99 GiB), 16 does not
    trainer te-fp8-b8-noac 1 --precision fp8 --backend te --batch-size 8 --no-activation-checkpointing
    trainer te-fp8-current-b8-noac 1 --precision fp8-current --backend te --batch-size 8 --no-activation-checkpointing
    trainer te-bf16-b8-noac 1 --precision bf16 --backend te --batch-size 8 --no-activation-checkpointing
    trainer torch-bf16-b8-noac 1 --precision bf16 --backend torch --batch-size 8 --no-activation-checkpointing
    trainer te-fp8-b4-noac 1 --precision fp8 --backend te --batch-size 4 --no-activation-checkpointing
    trainer te-fp8-b32-ac 1 --precision fp8 --backend te --batch-size 32 --activation-checkpointing
    ;;
  scaling)  # like for like with core's 1-GPU runs
    trainer te-bf16 2 --precision bf16 --backend te --batch-size $B --activation-checkpointing
    trainer te-fp8 2 --precision fp8 --backend te --batch-size $B --activation-checkpointing
    te_fsdp bf16 2 --dtype bf16 --no-fp8
    te_fsdp fp8 2 --precision fp8
    ;;
  *) echo "usage: $0 verify|core|best|scaling [GPU]" >&2; exit 2 ;;
esac
