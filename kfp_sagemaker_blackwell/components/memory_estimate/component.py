"""KFP definition of the memory estimate (the work is in ``launcher``).

Batch rule: the requested batch is used when it fits; when it fits only with
activation checkpointing and ``activation_checkpointing`` is ``auto``,
checkpointing is switched on; ``batch_size=0`` asks for the largest batch that
fits (without checkpointing when any batch fits without it).
"""

from typing import NamedTuple, Optional

from kfp.dsl import Markdown, Metrics, Output

from kfp_sagemaker_blackwell.common.component import component


@component(aws=False)
def memory_estimate(
    report: Output[Markdown],
    metrics: Output[Metrics],
    instance_type: str = "ml.p6-b200.48xlarge",
    instance_count: int = 1,
    world_size: int = 0,
    gpu: str = "",
    # catalog/parameters.py's MODEL, documented there:
    model_preset: str = "8b", num_layers: int = 0, hidden_size: int = 0, num_heads: int = 0,
    num_kv_heads: int = 0, ffn_hidden_size: int = 0, vocab_size: int = -1,
    mlp: str = "",
    seq_length: int = 2048,
    batch_size: int = 0,
    precisions: list = ["bf16", "fp8", "mxfp8", "nvfp4"],  # noqa: B006 (KFP default)
    activation_checkpointing: str = "auto",
    headroom: float = 0.05,
    backend: str = "te",
    param_dtype: str = "fp32",
    master_weights: bool = True,
    optimizer_state_dtype: str = "fp32",
    fsdp_version: int = 2,
    quantized_model_init: bool = False,
    single_gpu_fsdp: bool = True,
    cuda_graphs: bool = False,
    optimizer: str = "adamw-fused",
    dropout: float = 0.0,
    expandable_segments: bool = True,
    require_all_runnable: bool = False,
    max_candidate_batch_size: int = 0,
    instance_hour_prices: Optional[dict] = None,
    probe: str = "",
) -> NamedTuple(  # type: ignore[valid-type]
    "Outputs",
    [("plan", str), ("runnable_precisions", list), ("all_runnable", bool),
     ("batch_candidates", list)],
):
    """Predicts per-GPU peak memory and plans batch size and activation checkpointing.

    Before paying for GPUs: for each precision, will the training configuration fit
    in GPU memory, with which micro-batch, is activation checkpointing needed, and
    does the GPU run that precision at all (MXFP8 and NVFP4 need Blackwell). Pure
    Python (no GPU); the model of a training step (FSDP-sharded parameters,
    gradients, AdamW states, gathered weights, activations, full-vocabulary logits,
    TransformerEngine quantised weight copies, CUDA context, allocator reserve) is
    calibrated on an H200 (see benchmarks/memory/README.md). MXFP8 and NVFP4 are
    estimated from the formats' byte sizes and are not measured.

    Args:
        instance_type: SageMaker instance type (ml.p6-b200.48xlarge, ml.p6-b300.48xlarge,
            ml.p5.48xlarge, ml.p5e.48xlarge, ...). Empty to give ``gpu`` instead.
        instance_count: Instances (nodes) per training job.
        world_size: GPUs the model is sharded over (GPUs per node x nodes); 0 = all
            GPUs of ``instance_count`` instances. Must divide, or be a multiple of, the
            node's GPUs.
        gpu: A GPU name (B200, B300, H100, H200, ...) instead of an instance type.
        mlp: swiglu or gelu ("" = the preset's).
        seq_length: Tokens per sequence.
        batch_size: Micro-batch per GPU; 0 = the largest that fits.
        precisions: Precisions to plan for (fp32, bf16, fp16, fp8, fp8-current,
            fp8-block, mxfp8, nvfp4).
        activation_checkpointing: auto (on only when needed), on, or off.
        headroom: Fraction of GPU memory to keep free (0.05 = 5%).
        backend: Trainer backend: te (TransformerEngine layers) or torch.
        param_dtype: Dtype of the sharded parameters (fp32: they are the master weights).
        master_weights: Keep an fp32 master copy when param_dtype is 16-bit.
        optimizer_state_dtype: AdamW moment dtype (fp32 or bf16).
        fsdp_version: 2 (fully_shard) or 1 (FullyShardedDataParallel).
        quantized_model_init: TE quantized_model_init (weights stored quantised).
        single_gpu_fsdp: World size 1 only: FSDP2 as on many GPUs (the trainer's default), or
            false for the plain module (the trainer's --no-single-gpu-fsdp), which holds every
            block's 16-bit or quantised weight copy from its forward to its backward.
        cuda_graphs: The trainer's --cuda-graphs (one GPU, single_gpu_fsdp false, te backend,
            no checkpointing: "auto" plans without): every block's weight gradients live
            through the whole step, as the graphs' static outputs.
        optimizer: adamw-fused (AdamW(fused=True), in place: this project's trainer) or
            adamw-foreach (torch.optim.Adam's default on CUDA, one state-sized temporary:
            TE's examples/pytorch/fsdp/fsdp.py).
        dropout: Hidden dropout probability of the blocks (0: this trainer; 0.1: TE's
            fsdp.py, te.TransformerLayer's default); each block keeps its masks.
        expandable_segments: The CUDA allocator's expandable segments, as the training job
            will run: on by default (the trainer sets PYTORCH_CUDA_ALLOC_CONF to
            expandable_segments:True unless the job's environment has its own); False when
            the job's PYTORCH_CUDA_ALLOC_CONF leaves them off. On, the estimate adds a small
            reserve and batch 0 takes the largest batch that runs at full speed; off, the
            default allocator's fragmentation reserve.
        require_all_runnable: Fail when any requested precision is unsupported or
            predicted not to fit, instead of reporting it in the plan.
        max_candidate_batch_size: Cap on the batch sizes in ``batch_candidates``
            (0 = up to the largest that fits).
        instance_hour_prices: Instance type -> USD per instance-hour for the predicted
            cost per billion tokens (default: the shipped table, labelled "verify"; the
            plan's ``price_source`` says which was used).
        probe: A short measured run ("probe, then extrapolate"), as a JSON object
            {precision, batch_size, activation_checkpointing, tokens_per_s_per_gpu,
            instance_type or gpu, world_size, peak_memory_bytes, source, kind}; on the
            command line also @FILE. peak_memory_bytes: the peak reserved per GPU
            (parse_logs' peak_reserved_gib x 2^30, no CUDA context; compared with the
            estimate's peak reserved), 0 = not measured. Of the configuration this estimate plans for its
            precision, on its GPU type (any world size): the report shows the predicted,
            the probed and the corrected tokens/s (the measured / predicted ratio at the
            probe's world size, applied to the full run) and predicted against probed
            peak memory, with a warning when the memory estimate says the probe's own
            configuration cannot fit where it ran (the probe contradicts the model; the
            warning says what fits there). "" = none.

    Returns:
        plan: The MemoryPlan JSON (kfp_sagemaker_blackwell.planning.memory_plan) the training
            component reads with ``MemoryPlan.from_json(plan).entry_for(precision)``.
        runnable_precisions: Precisions that are supported and fit (for ParallelFor).
        all_runnable: True when every requested precision is runnable.
        batch_candidates: Configurations worth timing ({precision, batch_size,
            activation_checkpointing}: powers of two up to the largest that fits).
        report: Markdown table (KFP UI): per precision fits, batch, checkpointing,
            peak GiB per GPU and what the peak is made of (and a probe's comparison).
        metrics: Per precision peak GiB, fits, batch size, largest batches (with a probe:
            its probed and corrected tokens/s, probed peak GiB).
    """
    params = dict(locals())  # this signature's parameters: their one declaration
    from collections import namedtuple

    from kfp_sagemaker_blackwell.components.memory_estimate.launcher import run_component

    out = run_component(**{k: v for k, v in params.items() if k not in ("report", "metrics")})

    with open(report.path, "w") as f:
        f.write(out.markdown)
    for name, value in out.metrics.items():
        metrics.log_metric(name, value)
    print(out.markdown)
    outputs = namedtuple(  # type: ignore[name-match]
        "Outputs", ["plan", "runnable_precisions", "all_runnable", "batch_candidates"]
    )
    return outputs(out.plan, out.runnable_precisions, out.all_runnable, out.batch_candidates)
