"""Training data: a synthetic source with a known entropy floor, or token files.

Every batch is a pure function of (seed, step, rank, micro-batch): the data
position a checkpoint stores is the step, a resumed run sees exactly the
batches an uninterrupted run would, and runs that differ only in precision see
the same data.

Synthetic source (default). A hidden walk ``y[t+1] = y[t] + o[t] (mod V)``
where each offset ``o[t]`` is drawn independently from ``k`` distinct non-zero
offsets with probabilities ``1/2, 1/4, ..., 2^-(k-1), 2^-(k-1)``, and the
observed token is ``perm[y[t]]`` for a fixed random permutation. The tokens
form a Markov chain whose next-token distribution has exactly the entropy of
the offset distribution, so the best achievable cross-entropy (the entropy
floor) is known: ``1.75 ln 2 = 1.2130`` nats for ``k=4``. It is generated
vectorised (a cumulative sum), so it costs nothing even at sequence 8192.

Token files (``--data-dir`` or ``SM_CHANNEL_TRAIN``). A directory of ``*.bin``
files, each a flat little-endian array of token ids, with an optional
``meta.json``: ``{"dtype": "uint16" | "uint32", "vocab_size": N}`` (uint16 when
absent). The directory is checked once, at start-up (``kfp_sagemaker_blackwell.catalog.tokens``:
a damaged shard or meta.json fails the job naming the file). Training windows of
``seq_length + 1`` tokens start at uniformly drawn positions. ``python -m kfp_sagemaker_blackwell.trainer.make_tokens`` writes this format from text files
(byte-level, vocab 256).
"""

from __future__ import annotations

import numpy as np
import torch

from kfp_sagemaker_blackwell.catalog import tokens
from kfp_sagemaker_blackwell.trainer.model import _mix


class SyntheticMarkov:
    source = "synthetic"

    def __init__(self, vocab_size: int, seed: int, successors: int = 4):
        if vocab_size <= successors:
            raise ValueError(f"vocab_size={vocab_size}: must exceed successors={successors}")
        self.vocab_size = vocab_size
        self.seed = seed
        g = torch.Generator().manual_seed(_mix(seed, "synthetic-chain"))
        self.perm = torch.randperm(vocab_size, generator=g)
        self.offsets = 1 + torch.randperm(vocab_size - 1, generator=g)[:successors]
        k = successors
        probs = [2.0 ** -(i + 1) for i in range(k - 1)] + [2.0 ** -(k - 1)]
        self.probs = torch.tensor(probs, dtype=torch.float64)
        self.entropy_floor = float(-(self.probs * self.probs.log()).sum())

    def describe(self) -> dict:
        return {"source": self.source, "entropy_floor": round(self.entropy_floor, 6),
                "vocab_size": self.vocab_size, "successors": len(self.offsets),
                "kind": "markov-walk", "seed": self.seed}

    def batch(self, step: int, rank: int, micro: int, batch: int, seq: int) -> torch.Tensor:
        """Token ids, shape (batch, seq + 1), int64, on the CPU."""
        g = torch.Generator().manual_seed(_mix(self.seed, step, rank, micro))
        y0 = torch.randint(self.vocab_size, (batch, 1), generator=g)
        u = torch.rand(batch, seq, generator=g, dtype=torch.float64)
        idx = torch.bucketize(u, self.probs.cumsum(0)[:-1], right=True)
        y = (y0 + torch.cumsum(self.offsets[idx], dim=1)) % self.vocab_size
        return self.perm[torch.cat([y0, y], dim=1)]


class TokenFiles:
    source = "token-files"
    entropy_floor = None

    def __init__(self, directory: str, seed: int, vocab_size: int):
        checked = tokens.check(directory)  # a DataError naming the damaged file
        meta_vocab = checked.vocab_size
        if meta_vocab and meta_vocab > vocab_size:
            raise ValueError(
                f"vocab-size={vocab_size}: the token files use a vocabulary of {meta_vocab}; "
                f"set vocab-size >= {meta_vocab}"
            )
        dtype = np.dtype(checked.dtype).newbyteorder("<")
        self.arrays = [np.memmap(f, dtype=dtype, mode="r") for f in checked.files]
        self.lengths = np.array(checked.tokens, dtype=np.int64)
        self.vocab_size = vocab_size
        self.seed = seed
        self.directory = directory
        self.dtype = checked.dtype

    def describe(self) -> dict:
        return {"source": self.source, "entropy_floor": None, "directory": self.directory,
                "files": len(self.arrays), "tokens": int(self.lengths.sum()), "dtype": self.dtype}

    def batch(self, step: int, rank: int, micro: int, batch: int, seq: int) -> torch.Tensor:
        span = seq + 1
        room = np.maximum(self.lengths - span + 1, 0)
        if room.sum() <= 0:
            raise ValueError(f"seq-length={seq}: longer than every token file in {self.directory}")
        rng = np.random.default_rng(_mix(self.seed, step, rank, micro))
        starts = rng.integers(0, int(room.sum()), size=batch)
        bounds = np.cumsum(room)
        rows = []
        for s in starts:
            f = int(np.searchsorted(bounds, s, side="right"))
            off = int(s - (bounds[f - 1] if f else 0))
            rows.append(np.asarray(self.arrays[f][off:off + span], dtype=np.int64))
        out = torch.from_numpy(np.stack(rows))
        if int(out.max()) >= self.vocab_size:
            raise ValueError(
                f"vocab-size={self.vocab_size}: token id {int(out.max())} in {self.directory}; "
                "set vocab-size above the largest id"
            )
        return out


class RandomHidden:
    """Bare block stacks (vocab_size=0, TE fsdp.py's shape): random hidden states in, and
    the loss is the mean square of the output (a throughput workload, no convergence)."""

    source = "random-hidden"
    entropy_floor = None

    def __init__(self, hidden_size: int, seed: int):
        self.hidden_size, self.seed = hidden_size, seed

    def describe(self) -> dict:
        return {"source": self.source, "entropy_floor": None, "hidden_size": self.hidden_size}

    def batch_on(self, step: int, rank: int, micro: int, batch: int, seq: int, device, dtype) -> torch.Tensor:
        g = torch.Generator(device=device).manual_seed(_mix(self.seed, step, rank, micro))
        return torch.rand(batch, seq, self.hidden_size, generator=g, device=device, dtype=dtype)


def make_source(config) -> SyntheticMarkov | TokenFiles | RandomHidden:
    m = config.model
    if not m.vocab_size:
        return RandomHidden(m.hidden_size, config.seed)
    if config.data_dir:
        source = TokenFiles(config.data_dir, config.seed, m.vocab_size)
        if int(source.lengths.max()) < config.seq_length + 1:
            raise tokens.DataError(
                config.data_dir, f"its longest token file holds {int(source.lengths.max())} "
                f"tokens, fewer than a training window (seq-length {config.seq_length} + 1).",
                "give more tokens, or lower seq-length.")
        return source
    return SyntheticMarkov(m.vocab_size, config.seed, config.synthetic_successors)
