"""Model specification shared by the trainer and the memory estimator.

This module is torch-free on purpose: the memory estimate component and the
training component import it for planning, and the trainer image imports it to
build the model. One dataclass, one table of presets, one set of CLI flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.catalog.bounds import Bounds, UnknownName, within
from kfp_sagemaker_blackwell.catalog.errors import FieldError

MLP_TYPES = ("swiglu", "gelu")
NORM_TYPES = ("rmsnorm", "layernorm")
# The model dimensions (ModelSpec's size fields, in its order: the one list every side
# reads, the components' parameters and flags of those names included) and each one's
# valid range, read by ModelSpec.validate and by the --num-layers... flags.
# Generous: the largest open models (Llama 3.1 405B: 126 layers, hidden 16384, FFN 53248,
# 128 heads; Gemma's 256k vocabulary) sit well inside; beyond them no B200 node fits one block.
DIMENSION_BOUNDS: dict[str, Bounds] = {
    "num_layers": Bounds.parse("[1, 1024]"),
    "hidden_size": Bounds.parse("[1, 131072]"),
    "num_heads": Bounds.parse("[1, 1024]"),
    "num_kv_heads": Bounds.parse("[1, 1024]"),
    "ffn_hidden_size": Bounds.parse("[1, 524288]"),
    "vocab_size": Bounds.parse("[0, 4194304]"),
}


def _invalid(field: str, text: str) -> FieldError:
    """A ValueError (FieldError) whose text is ``text`` and whose field is ``field``."""
    return FieldError(field, text, text=text)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only causal LM (or, with ``vocab_size=0``, a bare block stack)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    bias: bool = False
    tie_embeddings: bool = False
    rotary: bool = True
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    def validate(self) -> ModelSpec:
        """Raises ValueError naming the field and what would be valid."""
        for field in (f for f in DIMENSION_BOUNDS if f != "vocab_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise _invalid(field, f"{field}={value!r}: must be a positive integer")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 0:
            raise _invalid(
                "vocab_size",
                f"vocab_size={self.vocab_size!r}: must be >= 0 (0 means no embedding or LM head)"
            )
        for field, bounds in DIMENSION_BOUNDS.items():
            if getattr(self, field) not in bounds:
                raise _invalid(field, f"{field}={getattr(self, field)!r}: outside its valid "
                               f"range {bounds}")
        if self.hidden_size % self.num_heads:
            divisors = [h for h in range(1, self.hidden_size + 1) if self.hidden_size % h == 0]
            near = sorted(divisors, key=lambda h: abs(h - self.num_heads))[:4]
            raise _invalid(
                "num_heads",
                f"num_heads={self.num_heads} does not divide hidden_size={self.hidden_size}; "
                f"valid nearby values: {sorted(near)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise _invalid(
                "num_kv_heads",
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads} "
                "(grouped-query attention); use num_kv_heads=num_heads for multi-head attention"
            )
        if self.rotary and self.head_dim % 2:
            raise _invalid(
                "hidden_size",
                f"head_dim={self.head_dim} (hidden_size/num_heads) must be even for rotary embeddings"
            )
        if self.mlp not in MLP_TYPES:
            raise _invalid("mlp", f"mlp={self.mlp!r}: must be one of {', '.join(MLP_TYPES)}")
        if self.norm not in NORM_TYPES:
            raise _invalid("norm", f"norm={self.norm!r}: must be one of {', '.join(NORM_TYPES)}")
        if self.tie_embeddings and self.vocab_size == 0:
            raise _invalid("tie_embeddings", "tie_embeddings=True needs vocab_size > 0")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    # ---- parameter counts (exact for this project's trainer) ----
    def attention_params(self) -> int:
        h, kv = self.hidden_size, self.kv_dim
        weights = h * h + 2 * h * kv + h * h  # q, k, v, o
        biases = (h + 2 * kv + h) if self.bias else 0
        return weights + biases

    def mlp_params(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        if self.mlp == "swiglu":
            return 3 * h * f + ((2 * f + h) if self.bias else 0)
        return 2 * h * f + ((f + h) if self.bias else 0)

    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def block_params(self) -> int:
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params()

    @property
    def block_kind(self) -> str:
        """The block's module structure, as far as the host's work per block depends on it (the
        norm, the MLP, biases, rotary embedding; not the sizes): "rmsnorm-swiglu" for the Llama
        presets, "layernorm-gelu-bias-norope" for te-fsdp-example. The throughput model times
        the host per block by kind (benchmarks/throughput/parts.py, its ``layer`` section)."""
        return (f"{self.norm}-{self.mlp}{'-bias' if self.bias else ''}"
                f"{'' if self.rotary else '-norope'}")

    def embedding_params(self) -> int:
        """Token embedding plus LM head (counted once when tied)."""
        if self.vocab_size == 0:
            return 0
        per = self.vocab_size * self.hidden_size
        return per if self.tie_embeddings else 2 * per

    def non_embedding_params(self) -> int:
        final_norm = self.norm_params() if self.vocab_size else 0
        return self.num_layers * self.block_params() + final_norm

    def total_params(self) -> int:
        return self.non_embedding_params() + self.embedding_params()

    # ---- FLOPs (torchtitan's convention) ----
    def flops_per_token(self, seq_length: int, include_lm_head: bool = True) -> float:
        """Training FLOPs per token: 6*N + 12*L*H*T (forward + backward).

        N counts the non-embedding parameters, plus the LM head when
        ``include_lm_head`` (its GEMM is real work; the embedding lookup is not).
        """
        n = self.non_embedding_params()
        if include_lm_head and self.vocab_size:
            n += self.vocab_size * self.hidden_size
        return 6.0 * n + 12.0 * self.num_layers * self.hidden_size * seq_length

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> ModelSpec:
        return dataclasses.replace(self, **changes)


# Presets by name. Shapes follow public model families so the numbers mean
# something to users; vocab 128256 is Llama 3's tokenizer, 152064 Qwen2.5's.
PRESETS: dict[str, ModelSpec] = {
    # Tiny models for tests and local CPU runs (byte-level vocab).
    "tiny": ModelSpec(2, 64, 4, 4, 176, 256, tie_embeddings=True),
    "small": ModelSpec(4, 128, 4, 2, 352, 256, tie_embeddings=True),
    # Llama 3.2 1B / 3B, Llama 3.1 8B.
    "1b": ModelSpec(16, 2048, 32, 8, 8192, 128256, tie_embeddings=True),
    "3b": ModelSpec(28, 3072, 24, 8, 8192, 128256, tie_embeddings=True),
    "8b": ModelSpec(32, 4096, 32, 8, 14336, 128256),
    # Qwen2.5 14B / 32B shapes.
    "14b": ModelSpec(48, 5120, 40, 8, 13824, 152064),
    "32b": ModelSpec(64, 5120, 40, 8, 27648, 152064),
    # A 64B-class Llama-style model (80 layers, hidden 8192): 62.5B parameters.
    "64b": ModelSpec(80, 8192, 64, 8, 24576, 128256),
    # TransformerEngine's examples/pytorch/fsdp/fsdp.py default block stack:
    # no embedding, LayerNorm, GELU MLP with bias, 16 heads (MHA).
    "te-fsdp-example": ModelSpec(
        24, 2048, 16, 16, 6144, 0, mlp="gelu", norm="layernorm", bias=True, rotary=False
    ),
}


def preset(name: str) -> ModelSpec:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise UnknownName("model_preset", name, PRESETS) from None


# ---- CLI flags shared by `python -m kfp_sagemaker_blackwell.trainer` and `python -m kfp_sagemaker_blackwell.components.memory_estimate` ----
_DIM_FLAGS = {name: "--" + name.replace("_", "-") for name in DIMENSION_BOUNDS}


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Adds the model flags. Explicit dimensions override the preset's."""
    g = parser.add_argument_group("model (a preset, optionally overridden per dimension)")
    g.add_argument(
        "--model-preset",
        default=None,
        help=f"model preset: {', '.join(PRESETS)} (default: tiny unless all dimensions are given)",
    )
    g.add_argument("--preset", dest="model_preset", default=None, help=argparse.SUPPRESS,
                   action=_deprecated("--preset", "--model-preset"))
    for field, text in (("num_layers", "transformer blocks"), ("hidden_size", "model width"),
                        ("num_heads", "attention heads (must divide hidden size)"),
                        ("num_kv_heads", "key/value heads for GQA (divides heads)"),
                        ("ffn_hidden_size", "MLP inner size"),
                        ("vocab_size", "vocabulary (0 = no embedding or LM head)")):
        bounds = DIMENSION_BOUNDS[field]
        g.add_argument(_DIM_FLAGS[field], type=within(int, bounds), help=f"{text} in {bounds}")
    g.add_argument("--mlp", choices=MLP_TYPES, help="swiglu (gated) or gelu (plain) MLP")
    g.add_argument("--norm", choices=NORM_TYPES, help="rmsnorm or layernorm")
    g.add_argument(
        "--bias", action=argparse.BooleanOptionalAction, default=None, help="biases in linears"
    )
    g.add_argument(
        "--tie-embeddings",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="share the embedding and LM head weights",
    )
    g.add_argument(
        "--rotary",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rotary position embeddings",
    )


def _deprecated(old: str, new: str) -> type[argparse.Action]:
    """A flag's old spelling: stores like ``new`` after a one-line note on stderr (the
    trainer's copy of kfp_sagemaker_blackwell.common.cli.deprecated; trainer/ imports nothing from
    components/)."""

    class Deprecated(argparse._StoreAction):
        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
            print(f"warning: {old} is deprecated; use {new}", file=sys.stderr)
            super().__call__(parser, namespace, values, option_string)

    return Deprecated


def spec_from_values(
    preset_name: str | None = None, **overrides: Any
) -> ModelSpec:
    """Builds a validated spec from a preset plus explicit overrides (None = keep)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - {f.name for f in dataclasses.fields(ModelSpec)}
    if unknown:
        raise ValueError(f"unknown model field(s): {', '.join(sorted(unknown))}")
    if preset_name:
        base = preset(preset_name)
    elif all(k in given for k in _DIM_FLAGS):
        base = ModelSpec(**{k: given[k] for k in _DIM_FLAGS})
    else:
        base = PRESETS["tiny"]
    if "num_heads" in given and "num_kv_heads" not in given and not preset_name:
        given["num_kv_heads"] = given["num_heads"]
    return base.replace(**given).validate()


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    return spec_from_values(getattr(args, "model_preset", None), **values)
