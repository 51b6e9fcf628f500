"""`trainer::TrainConfig` in its serde JSON form, and the learning-rate schedule.

Mirrors crates/trainer/src/train/config.rs (field names, defaults, `validate`) and
crates/trainer/src/optim.rs (`LrSchedule::lr_at`, `AdamWConfig`). Advantage normalisation (`ppo.adv_norm`)
and the aggregation weights are applied by the client before the batch is written, so the worker reads
`adv_norm` and `aggregation` only to validate them.
"""

import math
from dataclasses import dataclass, field

from .errors import WorkerError

AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
KL_ESTIMATORS = ("k1", "k2", "k3")
SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class LrSchedule:
    """optim.rs `LrSchedule`: linear warm-up from 0, then constant, linear or cosine decay."""

    lr: float = 1e-3
    kind: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_ratio: float = 0.0

    def lr_at(self, step):
        """optim.rs `LrSchedule::lr_at`: the rate of the step that follows `step` completed ones."""
        if step < self.warmup_steps:
            return self.lr * step / max(self.warmup_steps, 1)
        span = float(max(self.total_steps - self.warmup_steps, 1)) if self.total_steps > self.warmup_steps else 1.0
        progress = min((step - self.warmup_steps) / span, 1.0)
        floor = self.min_lr_ratio
        if self.kind == "constant":
            factor = 1.0
        elif self.kind == "linear":
            factor = floor + (1.0 - floor) * (1.0 - progress)
        else:
            factor = floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr * factor


@dataclass
class AdamWConfig:
    """optim.rs `AdamWConfig` (torch.optim.AdamW's update, decay on every parameter)."""

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01


@dataclass
class PpoConfig:
    """train/config.rs `PpoConfig`."""

    eps_clip: float = 0.2
    eps_clip_higher: float | None = None
    c_clip: float | None = None
    use_decoupled_loss: bool = False
    recompute_logprob: bool = False
    behav_imp_weight_cap: float | None = None
    kl_ctl: float = 0.0
    kl_estimator: str = "k1"
    entropy_coeff: float = 0.0
    adv_norm: dict | None = None
    temperature: float = 1.0

    def recomputes(self):
        return self.use_decoupled_loss or self.recompute_logprob


@dataclass
class TrainConfig:
    """train/config.rs `TrainConfig`."""

    schedule: LrSchedule = field(default_factory=LrSchedule)
    adamw: AdamWConfig = field(default_factory=AdamWConfig)
    gradient_clipping: float = 1.0
    max_tokens_per_mb: int = 8192
    aggregation: str = "token-mean"
    ppo: PpoConfig = field(default_factory=PpoConfig)


def _take(obj, cls, where, problems):
    """`cls` from the JSON object `obj`; unknown fields are problems (the Rust side writes every field)."""
    if obj is None:
        return cls()
    if not isinstance(obj, dict):
        problems.append(f"{where} must be an object")
        return cls()
    known = set(cls.__dataclass_fields__)
    for k in obj:
        if k not in known:
            problems.append(f"{where}.{k} is not a known field")
    kwargs = {k: v for k, v in obj.items() if k in known}
    return cls(**kwargs)


def _finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_train_config(obj):
    """A `TrainConfig` from its serde JSON form, checked as `TrainConfig::validate` checks it; the `config`
    error lists every problem."""
    problems = []
    if not isinstance(obj, dict):
        raise WorkerError("config", "train must be an object (trainer::TrainConfig's JSON form)")
    top = {k: v for k, v in obj.items()}
    cfg = _take({k: v for k, v in top.items() if k not in ("schedule", "adamw", "ppo")}, TrainConfig, "train", problems)
    cfg.schedule = _take(top.get("schedule"), LrSchedule, "train.schedule", problems)
    cfg.adamw = _take(top.get("adamw"), AdamWConfig, "train.adamw", problems)
    cfg.ppo = _take(top.get("ppo"), PpoConfig, "train.ppo", problems)
    s, a, p = cfg.schedule, cfg.adamw, cfg.ppo
    if s.kind not in SCHEDULES:
        problems.append(f"schedule.kind must be one of {', '.join(SCHEDULES)}, got {s.kind!r}")
    if not (_finite(s.lr) and s.lr >= 0):
        problems.append(f"lr must be finite and >= 0, got {s.lr}")
    if not (_finite(s.min_lr_ratio) and 0.0 <= s.min_lr_ratio <= 1.0):
        problems.append(f"min_lr_ratio must be in [0, 1], got {s.min_lr_ratio}")
    if not (isinstance(s.total_steps, int) and s.total_steps >= 1):
        problems.append(f"total_steps must be >= 1, got {s.total_steps}")
    if not (isinstance(s.warmup_steps, int) and s.warmup_steps >= 0):
        problems.append(f"warmup_steps must be >= 0, got {s.warmup_steps}")
    for name in ("beta1", "beta2"):
        v = getattr(a, name)
        if not (_finite(v) and 0.0 <= v < 1.0):
            problems.append(f"{name} must be in [0, 1), got {v}")
    if not (_finite(a.eps) and a.eps > 0):
        problems.append(f"eps must be finite and positive, got {a.eps}")
    if not (_finite(a.weight_decay) and a.weight_decay >= 0):
        problems.append(f"weight_decay must be finite and >= 0, got {a.weight_decay}")
    if not (_finite(cfg.gradient_clipping) and cfg.gradient_clipping >= 0):
        problems.append(f"gradient_clipping must be finite and >= 0, got {cfg.gradient_clipping}")
    if not (isinstance(cfg.max_tokens_per_mb, int) and cfg.max_tokens_per_mb >= 1):
        problems.append(f"max_tokens_per_mb must be >= 1, got {cfg.max_tokens_per_mb}")
    if cfg.aggregation not in AGGREGATIONS:
        problems.append(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {cfg.aggregation!r}")
    for name in ("eps_clip", "temperature"):
        v = getattr(p, name)
        if not (_finite(v) and v > 0):
            problems.append(f"{name} must be finite and positive, got {v}")
    if p.eps_clip_higher is not None and not (_finite(p.eps_clip_higher) and p.eps_clip_higher > 0):
        problems.append(f"eps_clip_higher must be finite and positive, got {p.eps_clip_higher}")
    if p.c_clip is not None and not (_finite(p.c_clip) and p.c_clip > 1):
        problems.append(f"c_clip must be finite and > 1, got {p.c_clip}")
    if p.behav_imp_weight_cap is not None:
        if not (_finite(p.behav_imp_weight_cap) and p.behav_imp_weight_cap > 1):
            problems.append(f"behav_imp_weight_cap must be finite and > 1, got {p.behav_imp_weight_cap}")
        if not p.use_decoupled_loss:
            problems.append("behav_imp_weight_cap needs use_decoupled_loss")
    for name in ("kl_ctl", "entropy_coeff"):
        v = getattr(p, name)
        if not (_finite(v) and v >= 0):
            problems.append(f"{name} must be finite and >= 0, got {v}")
    if p.kl_estimator not in KL_ESTIMATORS:
        problems.append(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {p.kl_estimator!r}")
    if problems:
        raise WorkerError("config", "; ".join(problems))
    return cfg
