"""The decoder-only causal LM in plain PyTorch (the ``torch`` backend).

No parallelism or precision policy lives here: FSDP2 and mixed precision are
applied by ``kfp_sagemaker_blackwell.trainer.parallel``. Activation checkpointing is the ``checkpoint_blocks``
flag that ``forward`` reads (set by ``kfp_sagemaker_blackwell.trainer.train`` from the configuration):
each block is then run under ``torch.utils.checkpoint`` (non-reentrant) and
recomputed in backward. The only precision hook is each linear layer's :class:`kfp_sagemaker_blackwell.trainer.emulation.Numerics`, which is plain
``F.linear`` on real hardware dtypes and an emulated low-precision GEMM
otherwise. With ``vocab_size=0`` the model is a bare block stack (TE's fsdp.py
shape): it takes hidden states and returns hidden states.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from kfp_sagemaker_blackwell.catalog.spec import ModelSpec
from kfp_sagemaker_blackwell.trainer import emulation, parallel


def root_output(t: torch.Tensor) -> torch.Tensor:
    """The model's output as FSDP2's root may return it: not a view.

    FSDP2 registers its pre-backward hook (which gathers the root's parameters again and
    reshards them after backward) on the root module's output. When that output is a view, an
    in-place op on it would rebase its autograd history onto the base and silently drop the
    hook (FSDP2 warns: "returned a view tensor"). The LM head's output is a view whenever its
    GEMM runs on the flattened tokens and is reshaped back inside an autograd Function: the
    emulated GEMMs here and TE's ``Linear`` both do. No path edits the logits in place (the
    loss reads them out of place), so the fix costs nothing: the same storage is returned as a
    non-view alias (``aten._unsafe_view``, which is how ``torch.matmul`` returns its reshaped
    product for the same reason), and the warning is an error in the tests."""
    if t._base is None:
        return t
    return torch.ops.aten._unsafe_view(t, t.shape)


class Linear(nn.Module):
    """A linear layer whose GEMMs follow a :class:`Numerics` (weight may be borrowed, for tying)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, numerics: emulation.Numerics,
                 own_weight: bool = True, amax_history_len: int = 1024):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.numerics = numerics
        self.weight = nn.Parameter(torch.empty(out_features, in_features)) if own_weight else None
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        if numerics.delayed:
            self.register_buffer("amax_state", emulation.new_amax_state(amax_history_len))
        else:
            self.amax_state = None

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        w = self.weight if weight is None else weight
        assert w is not None
        return emulation.linear(x, w, self.bias, self.numerics, self.amax_state)


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size, eps=spec.norm_eps)
    return nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps, bias=spec.bias)


def rotary_tables(seq: int, head_dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)  # (seq, head_dim), rotate-half layout
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return (x.float() * c + rot * s).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, numerics: emulation.Numerics, amax_len: int):
        super().__init__()
        self.spec = spec
        self.qkv = Linear(spec.hidden_size, spec.hidden_size + 2 * spec.kv_dim, spec.bias, numerics,
                          amax_history_len=amax_len)
        self.proj = Linear(spec.hidden_size, spec.hidden_size, spec.bias, numerics, amax_history_len=amax_len)
        self.round_to = numerics.out_dtype if numerics.precision != "fp32" else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, t, _ = x.shape
        s = self.spec
        q, k, v = self.qkv(x).split([s.hidden_size, s.kv_dim, s.kv_dim], dim=-1)
        q = q.view(b, t, s.num_heads, s.head_dim)
        k = k.view(b, t, s.num_kv_heads, s.head_dim)
        v = v.view(b, t, s.num_kv_heads, s.head_dim)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        if self.round_to is not None and q.dtype == torch.float32:
            # Emulation: attention runs in the 16-bit compute dtype, as TE's does.
            q, k, v = (emulation.round_to(y, self.round_to) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=s.num_kv_heads != s.num_heads)
        return self.proj(y.transpose(1, 2).reshape(b, t, s.hidden_size))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, numerics: emulation.Numerics, amax_len: int):
        super().__init__()
        self.gated = spec.mlp == "swiglu"
        width = 2 * spec.ffn_hidden_size if self.gated else spec.ffn_hidden_size
        self.fc1 = Linear(spec.hidden_size, width, spec.bias, numerics, amax_history_len=amax_len)
        self.fc2 = Linear(spec.ffn_hidden_size, spec.hidden_size, spec.bias, numerics, amax_history_len=amax_len)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return self.fc2(h)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, numerics: emulation.Numerics, amax_len: int = 1024):
        super().__init__()
        self.attn_norm = _norm(spec)
        self.attn = Attention(spec, numerics, amax_len)
        self.mlp_norm = _norm(spec)
        self.mlp = MLP(spec, numerics, amax_len)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


class CausalLM(nn.Module):
    """Embedding, blocks, final norm, LM head. ``blocks`` is a ModuleList so that FSDP2
    can shard per block from outside; ``checkpoint_blocks`` turns on activation
    checkpointing per block inside ``forward``."""

    def __init__(self, spec: ModelSpec, block_numerics: list[emulation.Numerics],
                 head_numerics: emulation.Numerics, amax_history_len: int = 1024):
        super().__init__()
        self.spec = spec
        self.blocks = nn.ModuleList(Block(spec, n, amax_history_len) for n in block_numerics)
        self.checkpoint_blocks = False
        self.embed_round = head_numerics.out_dtype if head_numerics.precision != "fp32" else None
        if spec.vocab_size:
            self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
            self.norm = _norm(spec)
            self.lm_head = Linear(spec.hidden_size, spec.vocab_size, False, head_numerics,
                                  own_weight=not spec.tie_embeddings, amax_history_len=amax_history_len)
        self._rope_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def rope(self, seq: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.spec.rotary:
            return None
        key = (seq, str(device))
        if key not in self._rope_cache:
            self._rope_cache[key] = rotary_tables(seq, self.spec.head_dim, self.spec.rope_theta, device)
        return self._rope_cache[key]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) -> logits, or hidden states -> hidden states when vocab_size=0."""
        if self.spec.vocab_size:
            h = parallel.cast_to_compute(self.tok_embeddings(inputs))
            if self.embed_round is not None and h.dtype == torch.float32:
                h = emulation.round_to(h, self.embed_round)
        else:
            h = inputs
        rope = self.rope(h.shape[1], h.device)
        for block in self.blocks:
            if self.checkpoint_blocks and torch.is_grad_enabled():
                from torch.utils.checkpoint import checkpoint

                h = checkpoint(block, h, rope, use_reentrant=False)
            else:
                h = block(h, rope)
        if not self.spec.vocab_size:
            return root_output(h)
        h = self.norm(h)
        weight = self.tok_embeddings.weight if self.spec.tie_embeddings else None
        return root_output(self.lm_head(h, weight))

    def amax_states(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for m in self.modules():
            state = getattr(m, "amax_state", None) if isinstance(m, Linear) else None
            if isinstance(state, torch.Tensor):
                out.append(state)
        return out


def _mix(*values: object) -> int:
    import hashlib

    digest = hashlib.sha256(",".join(map(str, values)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


# normal(0, INIT_STD) for every weight matrix; the output projections (attention proj, MLP
# fc2) by 1/sqrt(2 * layers) on top (GPT-2 / Megatron): init_weights draws them, and TE's blocks
# get the same distributions (te_init_methods) for the weights init_weights leaves to them
INIT_STD = 0.02


def output_init_std(spec: ModelSpec) -> float:
    return INIT_STD / math.sqrt(2 * spec.num_layers)


def te_init_methods(spec: ModelSpec) -> dict[str, Callable[[torch.Tensor], Any]]:
    """``te.TransformerLayer``'s ``init_method`` and ``output_layer_init_method``: the
    distributions init_weights draws. With FP8 primary weights (--quantized-model-init) TE's
    reset_parameters draws and quantises the blocks' weights itself and init_weights skips
    them; TE's own default (normal(0, 0.023) everywhere, no depth scaling) made the output
    projections 6.5x larger than the control's at 16 layers (session v11: the loss did not
    move in 16 steps)."""
    def normal(std: float) -> Callable[[torch.Tensor], Any]:
        return lambda t: torch.nn.init.normal_(t, mean=0.0, std=std)
    return {"init_method": normal(INIT_STD), "output_layer_init_method": normal(output_init_std(spec))}


@torch.no_grad()
def init_weights(model: nn.Module, spec: ModelSpec, seed: int,
                 only: Callable[[nn.Parameter], bool] | None = None) -> None:
    """Deterministic initialisation from the seed alone, identical for every precision and
    independent of sharding: each parameter is drawn in full from its own generator on the
    parameter's device and this rank keeps its FSDP shard (dim-0 chunk). normal(0, 0.02),
    output projections scaled by 1/sqrt(2 * layers) (GPT-2 / Megatron), zero biases, unit norms.
    Buffers (amax histories) are zeroed, so models built on the meta device can be materialised.
    ``only``: initialise just the parameters it accepts (each still drawn from its own index's
    generator, so it gets the value a full initialisation gives it); the others are left as they are."""
    out_std = output_init_std(spec)
    for index, (name, p) in enumerate(model.named_parameters()):
        if only is not None and not only(p):
            continue
        local = p.to_local() if hasattr(p, "to_local") else p
        if p.ndim == 1:
            local.fill_(1.0 if ("norm" in name and name.endswith("weight")) else 0.0)
            continue
        std = out_std if name.endswith(("proj.weight", "fc2.weight", "fc2_weight")) else INIT_STD
        device = local.device
        g = torch.Generator(device=device).manual_seed(_mix(seed, index))
        full = torch.empty(tuple(p.shape), dtype=torch.float32, device=device).normal_(0.0, std, generator=g)
        if local is not p:  # a DTensor sharded on dim 0 (FSDP2)
            full = _local_chunk(full, p)
        local.copy_(full.to(local.dtype))
    for name, b in model.named_buffers():
        if name.endswith("amax_state"):
            b.zero_()


def _local_chunk(full: torch.Tensor, p) -> torch.Tensor:
    import torch.distributed as dist

    world = p.device_mesh.size()
    rank = p.device_mesh.get_local_rank() if p.device_mesh.ndim == 1 else dist.get_rank()
    chunks = list(full.chunk(world, dim=0))
    if rank < len(chunks):
        return chunks[rank]
    return full.new_empty((0, *full.shape[1:]))
