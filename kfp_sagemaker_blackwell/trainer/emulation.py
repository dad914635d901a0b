"""Numerical emulation of TransformerEngine's low-precision GEMMs on the PyTorch backend.

Every linear layer of the PyTorch-backend model sends its GEMMs through
:func:`linear`: the inputs of each GEMM (forward ``y = x W^T``, data gradient
``dx = g W``, weight gradient ``dW = g^T x``) are quantised and dequantised
with the recipe's element format and scaling granularity, the product is
computed in fp32 and rounded to the compute dtype. The numbers are what the
format does to training; the speed is not (emulation is slower than bf16), and
every log line says ``emulated=1``.

Recipes (TE 2.x defaults):

- ``fp8`` DelayedScaling, HYBRID: E4M3 forward, E5M2 gradients, one scale per
  tensor from the max of an amax history (1024 steps), reduced across ranks.
- ``fp8-current`` Float8CurrentScaling, HYBRID: as above with the current amax.
- ``fp8-block`` Float8BlockScaling: E4M3, power-of-two scales, 1x128 blocks for
  activations and gradients, 128x128 blocks for weights.
- ``mxfp8`` MXFP8BlockScaling: E4M3, one E8M0 (power-of-two) scale per 32
  consecutive values along the GEMM's contraction dimension.
- ``nvfp4`` NVFP4BlockScaling: E2M1 values, one E4M3 scale per 16 values (16x16
  for weights) and an fp32 per-tensor scale. Gradients are rounded to nearest;
  TE's stochastic rounding and random Hadamard transform are not emulated.
- ``bf16`` / ``fp16``: GEMM inputs and outputs rounded to the 16-bit type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kfp_sagemaker_blackwell.catalog.precisions import COMPUTE_DTYPE, LOW_PRECISIONS

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E2M1_MAX = 6.0


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rounds to a floating dtype (round to nearest even) and back to x's dtype."""
    return x.to(dtype).to(x.dtype)


def cast_fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Saturating cast to E4M3 / E5M2 and back to fp32 (x already scaled)."""
    if fmt == "e4m3":
        return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return x.clamp(-E5M2_MAX, E5M2_MAX).to(torch.float8_e5m2).to(torch.float32)


# Rounding midpoints of the E2M1 grid. Ties go to the even code: down at 0.25, 1.25, 2.5, 5
# and up at 0.75, 1.75, 3.5, so those three boundaries sit one ulp lower (bucketize puts a value
# equal to a boundary in the lower bucket).
_E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_UP = (False, True, False, True, False, True, False)


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Rounds to the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to even, saturating at 6.

    One bucketize over the rounding midpoints (a single pass), instead of per-binade rounds.
    """
    bounds = torch.tensor(_E2M1_BOUNDS, dtype=v.dtype, device=v.device)
    up = torch.tensor(_E2M1_UP, device=v.device)
    bounds = torch.where(up, torch.nextafter(bounds, torch.zeros_like(bounds)), bounds)
    grid = torch.tensor(_E2M1_GRID, dtype=v.dtype, device=v.device)
    return grid[torch.bucketize(v.abs(), bounds)].copysign(v)


def _fmax(fmt: str) -> float:
    return {"e4m3": E4M3_MAX, "e5m2": E5M2_MAX}[fmt]


def _pow2_floor(u: torch.Tensor) -> torch.Tensor:
    """2**floor(log2 u) for u > 0, exact (frexp, no log rounding)."""
    _, e = torch.frexp(u)
    return torch.ldexp(torch.ones_like(u), e - 1)


def _pow2_ceil(u: torch.Tensor) -> torch.Tensor:
    """2**ceil(log2 u) for u > 0, exact."""
    m, e = torch.frexp(u)
    e = torch.where(m == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(u), e)


def _blocks(x: torch.Tensor, dim: int, size: int) -> tuple[torch.Tensor, int, tuple[int, ...]]:
    """Moves ``dim`` last, pads it to a multiple of ``size`` and splits it into blocks."""
    x = x.movedim(dim, -1).contiguous()
    shape = tuple(x.shape)
    n = shape[-1]
    pad = (-n) % size
    if pad:
        x = F.pad(x, (0, pad))
    return x.reshape(*shape[:-1], (n + pad) // size, size), n, shape


def _unblocks(xb: torch.Tensor, n: int, shape: tuple[int, ...], dim: int) -> torch.Tensor:
    x = xb.reshape(*shape[:-1], -1)[..., :n]
    return x.movedim(-1, dim)


def qdq_per_tensor(x: torch.Tensor, fmt: str, scale: torch.Tensor) -> torch.Tensor:
    """Per-tensor scaling with a given scale (quantised = x * scale)."""
    return cast_fp8(x * scale, fmt) / scale


def current_scale(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    """TE's scale = fp8_max / amax (margin 0); 1 where amax is 0 or not finite."""
    ok = torch.isfinite(amax) & (amax > 0)
    return torch.where(ok, _fmax(fmt) / torch.where(ok, amax, torch.ones_like(amax)), torch.ones_like(amax))


def qdq_fp8_blocks(x: torch.Tensor, dim: int, size: int, fmt: str = "e4m3") -> torch.Tensor:
    """Float8BlockScaling, 1D blocks along ``dim``, power-of-two scales."""
    xb, n, shape = _blocks(x.float(), dim, size)
    amax = xb.abs().amax(-1, keepdim=True)
    ok = amax > 0
    scale = torch.where(ok, _pow2_floor(_fmax(fmt) / torch.where(ok, amax, 1.0)), 1.0)
    return _unblocks(cast_fp8(xb * scale, fmt) / scale, n, shape, dim)


def qdq_fp8_blocks_2d(w: torch.Tensor, size: int, fmt: str = "e4m3") -> torch.Tensor:
    """Float8BlockScaling for weights: size x size tiles, power-of-two scales."""
    return _tiles(w, size, lambda t: qdq_fp8_blocks(t, -1, size * size, fmt))


def _tiles(w: torch.Tensor, size: int, fn) -> torch.Tensor:
    """Applies ``fn`` to the flattened size x size tiles of a 2D tensor (last dim holds a tile)."""
    rows, cols = w.shape
    pr, pc = (-rows) % size, (-cols) % size
    wp = F.pad(w.float(), (0, pc, 0, pr))
    r, c = wp.shape
    t = wp.reshape(r // size, size, c // size, size).permute(0, 2, 1, 3).reshape(r // size, c // size, size * size)
    t = fn(t)
    out = t.reshape(r // size, c // size, size, size).permute(0, 2, 1, 3).reshape(r, c)
    return out[:rows, :cols]


def qdq_mxfp8(x: torch.Tensor, dim: int) -> torch.Tensor:
    """MXFP8: E4M3 elements, one E8M0 scale per 32 values along ``dim``.

    The scale is rounded up to a power of two (TE's float_to_e8m0) so no block
    value saturates.
    """
    xb, n, shape = _blocks(x.float(), dim, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    ok = amax > 0
    s = torch.where(ok, _pow2_ceil(torch.where(ok, amax, 1.0) / E4M3_MAX), 1.0)
    return _unblocks(cast_fp8(xb / s, "e4m3") * s, n, shape, dim)


def _nvfp4_block(xb: torch.Tensor, global_amax: torch.Tensor) -> torch.Tensor:
    """NVFP4 on blocks in the last dim: E4M3 block scale, fp32 global scale."""
    ok_g = global_amax > 0
    s_enc = torch.where(ok_g, (E4M3_MAX * E2M1_MAX) / torch.where(ok_g, global_amax, 1.0), 1.0)
    amax = xb.abs().amax(-1, keepdim=True)
    sb = cast_fp8(amax / E2M1_MAX * s_enc, "e4m3")  # the stored E4M3 block scale
    dec = sb / s_enc  # dequantisation factor per block
    ok = dec > 0
    q = round_e2m1(xb / torch.where(ok, dec, 1.0))
    return torch.where(ok, q * dec, torch.zeros_like(xb))


def qdq_nvfp4(x: torch.Tensor, dim: int) -> torch.Tensor:
    """NVFP4 1D: 16-value blocks along ``dim``."""
    xf = x.float()
    g = xf.abs().amax()
    xb, n, shape = _blocks(xf, dim, 16)
    return _unblocks(_nvfp4_block(xb, g), n, shape, dim)


def qdq_nvfp4_2d(w: torch.Tensor) -> torch.Tensor:
    """NVFP4 for weights: 16x16 tiles (TE's 2D weight quantisation)."""
    g = w.float().abs().amax()
    return _tiles(w, 16, lambda t: _nvfp4_block(t, g))


# ---------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------

# Slots of the per-layer amax state: forward input, weight, output gradient.
X, W, G = 0, 1, 2


@dataclass(frozen=True)
class Numerics:
    """How one linear layer's GEMMs are computed."""

    precision: str  # fp32 | bf16 | fp16 | fp8 | fp8-current | fp8-block | mxfp8 | nvfp4
    out_dtype: torch.dtype | None  # dtype the GEMM outputs are rounded to (None: fp32)

    @property
    def quantised(self) -> bool:
        return self.precision in LOW_PRECISIONS

    @property
    def delayed(self) -> bool:
        return self.precision == "fp8"


def numerics_for(precision: str) -> Numerics:
    out = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[COMPUTE_DTYPE[precision]]
    return Numerics(precision, out)


def _q_operand(n: Numerics, t: torch.Tensor, slot: int, dim: int, state: torch.Tensor | None) -> torch.Tensor:
    """Quantise-dequantise one GEMM operand whose contraction dimension is ``dim``."""
    p = n.precision
    if p == "fp32":
        return t
    if p in ("bf16", "fp16"):
        return round_to(t, n.out_dtype)  # type: ignore[arg-type]
    fmt = "e5m2" if slot == G and p in ("fp8", "fp8-current") else "e4m3"
    if p == "fp8":
        assert state is not None
        amax_now = t.detach().abs().amax().float()
        # Row 0 holds this step's amax (reduced and rolled into the history by
        # end_step); rows 1.. the history. The scale uses the history only.
        state[0, slot] = torch.maximum(state[0, slot], amax_now)
        hist_max = state[1:, slot].amax()
        return qdq_per_tensor(t.float(), fmt, current_scale(hist_max, fmt))
    if p == "fp8-current":
        amax_now = t.detach().abs().amax().float()
        return qdq_per_tensor(t.float(), fmt, current_scale(amax_now, fmt))
    if p == "fp8-block":
        if slot == W:
            return qdq_fp8_blocks_2d(t, 128)
        return qdq_fp8_blocks(t, dim, 128)
    if p == "mxfp8":
        return qdq_mxfp8(t, dim)
    if p == "nvfp4":
        if slot == W:
            return qdq_nvfp4_2d(t)
        return qdq_nvfp4(t, dim)
    raise ValueError(f"precision={p!r}: no emulation")


def _out(n: Numerics, y: torch.Tensor) -> torch.Tensor:
    return y if n.out_dtype is None else round_to(y, n.out_dtype)


# Operands whose quantised form does not depend on the GEMM direction (per-tensor scaling,
# 16-bit rounding, 2D weight tiles): quantised once in forward and reused in backward, as TE does.
_X_REUSABLE = ("bf16", "fp16", "fp8", "fp8-current")
_W_REUSABLE = ("bf16", "fp16", "fp8", "fp8-current", "fp8-block", "nvfp4")


class _EmulatedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, numerics, state):  # type: ignore[override]
        ctx.numerics, ctx.state = numerics, state
        ctx.has_bias = bias is not None
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        x2 = x.reshape(-1, x.shape[-1]).float()
        qx = _q_operand(numerics, x2, X, 1, state)
        qw = _q_operand(numerics, weight.float(), W, 1, state)
        p = numerics.precision
        ctx.save_for_backward(qx if p in _X_REUSABLE else x2, qw if p in _W_REUSABLE else weight)
        y = qx @ qw.t()
        if bias is not None:
            y = y + bias.float()
        return _out(numerics, y).reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        xs, ws = ctx.saved_tensors
        n, state = ctx.numerics, ctx.state
        p = n.precision
        g2 = grad.reshape(-1, grad.shape[-1]).float()
        # dgrad contracts over the output features; wgrad over the tokens.
        qw = ws.float() if p in _W_REUSABLE else _q_operand(n, ws.float(), W, 0, state)
        qx = xs if p in _X_REUSABLE else _q_operand(n, xs, X, 0, state)
        if p in ("fp8", "fp8-current"):  # per-tensor: one quantised gradient serves both GEMMs
            qg_row = qg_col = _q_operand(n, g2, G, 1, state)
        else:
            qg_row, qg_col = _q_operand(n, g2, G, 1, state), _q_operand(n, g2, G, 0, state)
        dx = _out(n, qg_row @ qw)
        dw = _out(n, qg_col.t() @ qx)
        db = g2.sum(0).to(ctx.w_dtype) if ctx.has_bias else None
        return dx.reshape(ctx.x_shape).to(ctx.x_dtype), dw.to(ctx.w_dtype), db, None, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, numerics: Numerics,
           state: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with the recipe's emulated GEMM numerics (fp32: plain F.linear)."""
    if numerics.precision == "fp32":
        return F.linear(x, weight, bias)
    return _EmulatedLinear.apply(x, weight, bias, numerics, state)


def end_step(states: list[torch.Tensor], group=None) -> None:
    """DelayedScaling bookkeeping after a step: reduce this step's amaxes across ranks
    (max) and roll them into each layer's history (TE's amax_reduction_group)."""
    if not states:
        return
    cur = torch.stack([s[0] for s in states])  # (layers, 3)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(cur, op=dist.ReduceOp.MAX, group=group)
    for s, c in zip(states, cur, strict=True):
        hist = s[1:]
        hist.copy_(torch.roll(hist, 1, dims=0))
        hist[0] = c
        s[0].zero_()


def new_amax_state(history_len: int) -> torch.Tensor:
    """Row 0: this step's amax per slot (input, weight, gradient); rows 1..: history."""
    return torch.zeros(history_len + 1, 3)
