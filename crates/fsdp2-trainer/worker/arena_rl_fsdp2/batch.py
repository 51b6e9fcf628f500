"""The batch file of `arena-rl-trainer/1` (docs/trainer-protocol.md, "The batch file"), its checks, and
packing into micro-batches.

Checks mirror crates/trainer/src/train/batch.rs (`check_tokens`, `RlBatch::check`); packing mirrors
crates/trainer/src/train/pack.rs (`effective_len`, first-fit decreasing `plan`, `pack`,
`Temperatures::inverse`). What is new here is spreading the micro-batches over data-parallel ranks.
"""

from dataclasses import dataclass

import numpy as np
from safetensors import safe_open

from . import PROTOCOL
from .errors import WorkerError

SPEC = {
    "tokens": ("I32", 1),
    "loss_mask": ("U8", 1),
    "logprobs": ("F32", 1),
    "versions": ("I64", 1),
    "temperatures": ("F32", 1),
    "truncated": ("U8", 1),
    "offsets": ("I64", 1),
    "advantages": ("F32", 1),
    "weights": ("F32", 1),
    "group_sizes": ("I64", 1),
}
NP_DTYPES = {"I32": np.int32, "U8": np.uint8, "F32": np.float32, "I64": np.int64}


@dataclass
class Batch:
    kind: str
    step: int
    policy_version: int
    tokens: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    temperatures: np.ndarray
    truncated: np.ndarray
    offsets: np.ndarray
    advantages: np.ndarray
    weights: np.ndarray
    group_sizes: np.ndarray

    @property
    def sequences(self):
        return len(self.offsets) - 1


def read_batch(path, vocab_size):
    """Reads and checks a batch file; a `batch` error names the tensor, sequence and token."""
    try:
        f = safe_open(path, framework="numpy")
    except Exception as e:  # noqa: BLE001 - the reader's own error, named
        raise WorkerError("batch", f"cannot read batch file {path}: {e}") from None
    with f:
        meta = f.metadata() or {}
        arrays = {}
        for name in SPEC:
            if name not in f.keys():
                raise WorkerError("batch", f"batch file {path} has no tensor `{name}`")
            arrays[name] = f.get_tensor(name)
    for name, (dtype, ndim) in SPEC.items():
        a = arrays[name]
        if a.dtype != NP_DTYPES[dtype] or a.ndim != ndim:
            raise WorkerError("batch", f"tensor `{name}` must be {dtype} of rank {ndim}, got {a.dtype} of shape {list(a.shape)}")
    if meta.get("protocol") != PROTOCOL:
        raise WorkerError("batch", f"batch metadata protocol is {meta.get('protocol')!r}, the worker speaks {PROTOCOL}")
    kind = meta.get("kind")
    if kind not in ("grpo", "sft"):
        raise WorkerError("batch", f"batch metadata kind must be grpo or sft, got {kind!r}")
    try:
        step = int(meta.get("step"))
        policy_version = int(meta.get("policy_version", "0"))
    except (TypeError, ValueError):
        raise WorkerError("batch", "batch metadata step and policy_version must be integers") from None
    b = Batch(kind=kind, step=step, policy_version=policy_version, **arrays)
    check(b, vocab_size)
    return b


def check(b, vocab):
    """batch.rs `check_tokens` and `RlBatch::check`, over the flat arrays."""
    t = len(b.tokens)
    for name in ("loss_mask", "logprobs", "versions", "temperatures", "truncated"):
        n = len(getattr(b, name))
        if n != t:
            raise WorkerError("batch", f"`{name}` has {n} entries for {t} tokens")
    s = len(b.offsets) - 1
    if s < 1:
        raise WorkerError("batch", "the batch has no sequences")
    if b.offsets[0] != 0 or b.offsets[-1] != t:
        raise WorkerError("batch", f"offsets must run from 0 to {t}, got {int(b.offsets[0])}..{int(b.offsets[-1])}")
    for name in ("advantages", "weights"):
        n = len(getattr(b, name))
        if n != s:
            raise WorkerError("batch", f"`{name}` has {n} entries for {s} sequences")
    if len(b.group_sizes) and (int(b.group_sizes.sum()) != s or (b.group_sizes < 1).any()):
        raise WorkerError("batch", f"group_sizes must be positive and sum to {s} sequences, got {b.group_sizes.tolist()}")
    lens = np.diff(b.offsets)
    if (lens < 1).any():
        i = int(np.argmax(lens < 1))
        raise WorkerError("batch", f"sequence {i}: tokens is empty")
    if ((b.tokens < 0) | (b.tokens >= vocab)).any():
        j = int(np.argmax((b.tokens < 0) | (b.tokens >= vocab)))
        i = int(np.searchsorted(b.offsets, j, side="right") - 1)
        raise WorkerError("batch", f"sequence {i}: token {int(b.tokens[j])} is outside the vocabulary of {vocab}")
    first = b.loss_mask[b.offsets[:-1]]
    if first.any():
        i = int(np.argmax(first != 0))
        raise WorkerError("batch", f"sequence {i}: loss_mask[0] is set, but the first token has no context to be predicted from")
    for name, arr in (("advantages", b.advantages), ("weights", b.weights)):
        bad = ~np.isfinite(arr) | ((arr < 0) if name == "weights" else False)
        if bad.any():
            i = int(np.argmax(bad))
            raise WorkerError("batch", f"sequence {i}: {name[:-1]} {float(arr[i])} is not finite" + (" and >= 0" if name == "weights" else ""))
    if b.kind == "grpo":
        m = b.loss_mask != 0
        bad = m & ~(np.isfinite(b.logprobs) & (b.logprobs <= 0))
        if bad.any():
            j = int(np.argmax(bad))
            i = int(np.searchsorted(b.offsets, j, side="right") - 1)
            raise WorkerError("batch", f"sequence {i}: logprobs[{j - int(b.offsets[i])}] = {float(b.logprobs[j])} is not a log-probability")
        bad = m & ~(np.isfinite(b.temperatures) & (b.temperatures >= 0))
        if bad.any():
            j = int(np.argmax(bad))
            i = int(np.searchsorted(b.offsets, j, side="right") - 1)
            raise WorkerError("batch", f"sequence {i}: temperatures[{j - int(b.offsets[i])}] = {float(b.temperatures[j])} is not a temperature")


def effective_len(mask):
    """pack.rs `effective_len`: up to and including the last trained token; 0 when nothing is trained."""
    nz = np.flatnonzero(mask)
    return int(nz[-1]) + 1 if len(nz) else 0


def plan(lengths, max_tokens):
    """pack.rs `plan`: first-fit decreasing into micro-batches of at most `max_tokens` tokens (a longer
    sequence gets one of its own); each lists its sequences longest first."""
    order = sorted((i for i in range(len(lengths)) if lengths[i] > 0), key=lambda i: (-lengths[i], i))
    bins = []
    for i in order:
        n = lengths[i]
        for b in bins:
            if b[0] + n <= max_tokens:
                b[0] += n
                b[1].append(i)
                break
        else:
            bins.append([n, [i]])
    return [(used, seqs) for used, seqs in bins]


def spread(bins, world):
    """The micro-batches of each data-parallel rank: largest first to the rank with fewest tokens so far,
    then padded with empty micro-batches (None) so every rank runs the same number of passes."""
    loads = [0] * world
    per = [[] for _ in range(world)]
    for used, seqs in sorted(bins, key=lambda b: -b[0]):
        r = min(range(world), key=lambda k: (loads[k], k))
        loads[r] += used
        per[r].append(seqs)
    n = max((len(p) for p in per), default=0)
    for p in per:
        p.extend([None] * (n - len(p)))
    return per


@dataclass
class Packed:
    """pack.rs `Packed`: one row of sequences end to end, each at positions from 0."""

    tokens: list
    positions: list
    runs: list  # (start, len, count): runs of equal-length segments
    rows: list  # for each trained token, the row whose output predicts it
    targets: list
    origin: list  # (sequence, flat token index)
    inv_temperatures: list

    def trained(self):
        return len(self.targets)


def inverse_temperature(x, default):
    """pack.rs `Temperatures::inverse`: the recorded temperature; greedy (<= 0) counts as 1."""
    if x is None:
        t = default
    else:
        t = float(x) if x > 0 else 1.0
    return float(np.float32(1.0 / t))


def pack(b, order, lens, scored_at_one):
    """pack.rs `pack` over the flat arrays; SFT scores every token at temperature 1."""
    p = Packed([], [], [], [], [], [], [])
    for s in order:
        n = lens[s]
        o = int(b.offsets[s])
        start = len(p.tokens)
        p.tokens.extend(b.tokens[o : o + n].tolist())
        p.positions.extend(range(n))
        mask = b.loss_mask[o : o + n]
        for t in np.flatnonzero(mask[1:]) + 1:
            t = int(t)
            p.rows.append(start + t - 1)
            p.targets.append(int(b.tokens[o + t]))
            p.origin.append((s, o + t))
            p.inv_temperatures.append(1.0 if scored_at_one else inverse_temperature(b.temperatures[o + t], 1.0))
        if p.runs and p.runs[-1][1] == n:
            st, ln, c = p.runs[-1]
            p.runs[-1] = (st, ln, c + 1)
        else:
            p.runs.append((start, n, 1))
    return p


def micro_batches(b, max_tokens, world, rank):
    """This rank's packed micro-batches (None for padding), the plan's shape
    `(sequences, forward_tokens, micro_batches)`, and the passes per rank."""
    lens = [effective_len(b.loss_mask[int(b.offsets[s]) : int(b.offsets[s + 1])]) for s in range(b.sequences)]
    bins = plan(lens, max_tokens)
    if not bins:
        raise WorkerError("batch", "no sequence has a trained token")
    mine = spread(bins, world)[rank]
    counts = [int(b.loss_mask[int(b.offsets[s]) : int(b.offsets[s + 1])].sum()) for s in range(b.sequences)]
    shape = (sum(1 for c in counts if c > 0), sum(lens), len(bins))
    packs = [None if seqs is None else pack(b, seqs, lens, b.kind == "sft") for seqs in mine]
    return packs, shape


