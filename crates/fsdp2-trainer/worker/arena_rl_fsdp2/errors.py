"""Typed errors of `arena-rl-trainer/1` (docs/trainer-protocol.md, "Errors")."""

KINDS = ("batch", "config", "oom", "rank_lost", "protocol", "busy", "auth", "path", "internal")


class WorkerError(Exception):
    """An error of one of the protocol's kinds, naming the rank and step when known."""

    def __init__(self, kind, message, rank=None, step=None):
        assert kind in KINDS, kind
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.rank = rank
        self.step = step

    def to_json(self):
        out = {"kind": self.kind, "message": self.message}
        if self.rank is not None:
            out["rank"] = self.rank
        if self.step is not None:
            out["step"] = self.step
        return out

    def __str__(self):
        where = []
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.step is not None:
            where.append(f"step {self.step}")
        prefix = ", ".join(where)
        return f"{prefix}: {self.kind}: {self.message}" if prefix else f"{self.kind}: {self.message}"


def classify(exc, rank=None, step=None):
    """Any exception as a WorkerError: torch's out-of-memory as `oom`, a failed or timed-out collective as
    `rank_lost`, anything else as `internal`."""
    import torch

    if isinstance(exc, WorkerError):
        if exc.rank is None:
            exc.rank = rank
        if exc.step is None:
            exc.step = step
        return exc
    text = " ".join(str(exc).split()).lower()[:500]
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text:
        return WorkerError("oom", f"out of memory: {text}", rank, step)
    dist_errors = tuple(
        e for e in (getattr(torch.distributed, "DistBackendError", None), getattr(torch.distributed, "DistError", None)) if e
    )
    if (dist_errors and isinstance(exc, dist_errors)) or any(
        w in text for w in ("timed out", "timeout", "connection reset", "connection closed", "broken pipe", "gloo", "nccl")
    ):
        return WorkerError("rank_lost", f"a collective failed: {text}", rank, step)
    return WorkerError("internal", f"{type(exc).__name__}: {text}", rank, step)
