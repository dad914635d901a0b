#!/usr/bin/env bash
# A quick check of the trainer on the GPU machine after TE is installed (small model, a few steps).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
common=(--model-preset small --seq-length 256 --max-steps 4 --log-every 2 --model-dir "" --output-data-dir "")
for p in bf16 fp8 fp8-current fp8-block; do
  echo "### te $p"
  CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m kfp_sagemaker_blackwell.trainer "${common[@]}" --precision $p --backend te \
    --checkpoint-dir /tmp/ck_$p --checkpoint-every 2 --output-dir /tmp/o_$p 2>&1 | grep -E "\[trainer\] (step|summary|event|recipe|checkpoint)|Error" | cut -c1-400 | tail -6
done
echo "### mxfp8 refusal"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m kfp_sagemaker_blackwell.trainer "${common[@]}" --precision mxfp8 --output-dir /tmp/o_mx 2>&1 | tail -2 | cut -c1-400
echo "rc=$? failure: $(cat /tmp/o_mx/failure)"
echo "### te fp8 activation checkpointing + quantized_model_init"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m kfp_sagemaker_blackwell.trainer "${common[@]}" --precision fp8 --backend te --activation-checkpointing --checkpoint-dir "" --output-dir /tmp/o_ac 2>&1 | grep -E "\[trainer\] (step|summary)|Error" | cut -c1-300 | tail -3
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m kfp_sagemaker_blackwell.trainer "${common[@]}" --precision fp8 --backend te --quantized-model-init --checkpoint-dir /tmp/ck_q --checkpoint-every 2 --output-dir /tmp/o_q 2>&1 | grep -E "\[trainer\] (step|summary|checkpoint)|Error" | cut -c1-300 | tail -4
echo "### torch bf16 + emulated fp8 on GPU"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m kfp_sagemaker_blackwell.trainer "${common[@]}" --precision bf16 --backend torch --checkpoint-dir "" --output-dir /tmp/o_t 2>&1 | grep -E "\[trainer\] (step|summary)|Error" | cut -c1-300 | tail -2
echo "### 2 GPUs te fp8 via train.sh, resume"
for run in 1 2; do
  SM_NUM_GPUS=2 PYTHON=python3 timeout 180 bash trainer/train.sh "${common[@]}" --precision fp8 --backend te --max-steps $((run * 3)) \
    --checkpoint-dir /tmp/ck2 --checkpoint-every 3 --output-dir /tmp/o2 2>&1 | grep -E "\[trainer\] (step|summary|checkpoint|world)|Error" | cut -c1-300 | tail -5
done
