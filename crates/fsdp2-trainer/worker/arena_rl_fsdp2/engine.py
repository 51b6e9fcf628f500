"""The training engine, in process: init, GRPO and SFT steps, publish, save and load, on every rank of a
`torch.distributed` job (one process a device). The server (server.py) drives the same class; so do benches.

Mirrors crates/trainer/src/train/learner.rs (`grpo_gradients`, `grpo_step`, `sft_step`, `apply`), loss.rs
(the per-token objectives), stats.rs (`StepStats`, `RangeAcc`) and optim.rs (torch AdamW's update, global
norm clipping with `clip_grad_norm_`'s rule, the schedule): each formula below names the file it mirrors.
"""

import hashlib
import json
import math
import os
import shutil
import time

import numpy as np
import torch
import torch.distributed as dist

from . import PROTOCOL
from .batch import micro_batches, read_batch
from .config import parse_train_config
from .errors import WorkerError
from .model import ARCHITECTURES, ATTN, Policy, register

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
SHARD_BYTES = 4 << 30
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def _fully_shard():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def init_distributed(timeout_s=None):
    """Initialises `torch.distributed` from torchrun's environment, or as a world of one when run alone;
    returns the device. Collectives time out after `timeout_s` (ARENA_RL_TRAINER_COLLECTIVE_TIMEOUT_S,
    default 600 s), so a lost rank ends a step with a `rank_lost` error rather than a hang."""
    import datetime

    if timeout_s is None:
        timeout_s = float(os.environ.get("ARENA_RL_TRAINER_COLLECTIVE_TIMEOUT_S", "600"))
    timeout = datetime.timedelta(seconds=timeout_s)
    cuda = torch.cuda.is_available() and os.environ.get("ARENA_RL_TRAINER_DEVICE", "") != "cpu"
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return device


class RangeAcc:
    """stats.rs `RangeAcc`, mergeable across ranks."""

    def __init__(self):
        self.min, self.max, self.sum, self.n = math.inf, -math.inf, 0.0, 0

    def push_all(self, v):
        if len(v):
            self.min = min(self.min, float(v.min()))
            self.max = max(self.max, float(v.max()))
            self.sum += float(v.sum())
            self.n += len(v)

    def merge(self, o):
        self.min, self.max = min(self.min, o.min), max(self.max, o.max)
        self.sum += o.sum
        self.n += o.n

    def finish(self):
        return {"min": self.min, "mean": self.sum / self.n, "max": self.max} if self.n else None


RANGES = ("ratio", "behave", "adv", "staleness", "drift", "drift_truncated")


class Tally:
    """learner.rs `Tally`: per-token statistics of one step, on one rank."""

    def __init__(self):
        self.has_ref = False
        self.tokens = self.clipped = self.dual_clipped = self.dropped = 0
        self.log_ratio = self.entropy = self.ref_kl = self.loss = 0.0
        for r in RANGES:
            setattr(self, r, RangeAcc())

    def merge(self, o):
        self.has_ref |= o.has_ref
        for k in ("tokens", "clipped", "dual_clipped", "dropped", "log_ratio", "entropy", "ref_kl", "loss"):
            setattr(self, k, getattr(self, k) + getattr(o, k))
        for r in RANGES:
            getattr(self, r).merge(getattr(o, r))


def kl_estimate(log_ratio, estimator):
    """loss.rs `kl_estimate` / `kl_value`: Schulman's k1, k2, k3 of `log_ratio = logp - ref_logp` (tensor or
    numpy)."""
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return log_ratio * log_ratio * 0.5
    exp = torch.exp if isinstance(log_ratio, torch.Tensor) else np.exp
    return exp(-log_ratio) - 1.0 + log_ratio


def clipped_pg(logp, prox, adv, ppo):
    """loss.rs `clipped_pg`: `max(-A r, -A clip(r, 1 - eps, 1 + eps_high))`, capped at `c |A|` by the dual clip."""
    ratio = (logp - prox).exp()
    high = ppo.eps_clip_higher if ppo.eps_clip_higher is not None else ppo.eps_clip
    clipped = ratio.clamp(1.0 - ppo.eps_clip, 1.0 + high)
    pg = torch.maximum(-adv * ratio, -adv * clipped)
    if ppo.c_clip is not None:
        pg = torch.minimum(pg, adv.abs() * ppo.c_clip)
    return pg


def behaviour_weight(prox, behave, cap):
    """loss.rs `behaviour_weight`: `exp(prox - behave)` in f32, 0 above the cap (compared in f64)."""
    w = np.exp((prox - behave).astype(np.float32)).astype(np.float32)
    if cap is not None:
        w = np.where(w.astype(np.float64) > cap, np.float32(0.0), w).astype(np.float32)
    return w


class Engine:
    """One rank's share of the trainer. Every rank calls every method in the same order."""

    def __init__(self, device=None, obj_group=None):
        if device is None:
            device = init_distributed()
        self.device = device
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.obj_group = obj_group
        self.state = "new"
        self.steps = 0
        self.model_info = None
        self.policy = None
        self.reference = None
        self.optimizer = None
        self.train = None

    # ---- hello / init ----------------------------------------------------------------------------------

    def hello(self):
        import transformers

        return {
            "protocol": PROTOCOL,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "world_size": self.world,
            "mesh": {"dp": self.world},
            "device": self.device.type,
            "model": self.model_info,
            "step": self.steps,
            "state": self.state,
        }

    def _load_lm(self, path, activation_checkpointing):
        from transformers import AutoModelForCausalLM

        register()
        # In the checkpoint's own dtype: each layer becomes f32 only as it is sharded (`_shard`), so a rank
        # holds the whole model once, in the checkpoint's dtype, and then only its shard in f32.
        lm = AutoModelForCausalLM.from_pretrained(path, dtype="auto", attn_implementation=ATTN)
        self._checkpointing(lm, activation_checkpointing)
        return lm

    def _build(self, path, ac, param_dtype, chunk):
        """The sharded policy of the model folder `path`: each rank loads the whole model
        (ARENA_RL_TRAINER_LOAD=each, the default), or only rank 0 reads the weights and broadcasts them into the
        others' shards, which build the model on the meta device (ARENA_RL_TRAINER_LOAD=rank0: one copy of the
        weights in host memory per node's rank 0 rather than per rank)."""
        mode = os.environ.get("ARENA_RL_TRAINER_LOAD", "each")
        if mode not in ("each", "rank0"):
            raise WorkerError("config", f"ARENA_RL_TRAINER_LOAD must be each or rank0, got {mode!r}")
        if mode == "each":
            lm = self._load_lm(path, ac)
            return lm, self._shard(Policy(lm, chunk), param_dtype)
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from transformers import AutoConfig, AutoModelForCausalLM

        register()
        cfg = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=ATTN)
        self._checkpointing(lm, ac)
        policy = self._shard(Policy(lm, chunk), param_dtype)
        policy.to_empty(device=self.device)
        # Buffers that are not in the checkpoint (the rotary frequencies) are computed again on the device.
        rotary = lm.model.rotary_emb
        with torch.device(self.device):
            lm.model.rotary_emb = type(rotary)(config=lm.config)
        full = {}
        if self.rank == 0:
            files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
            for f in files:
                for k, v in load_file(os.path.join(path, f)).items():
                    full["lm." + k] = v.float()
            if getattr(cfg, "tie_word_embeddings", False) and "lm.lm_head.weight" not in full:
                full["lm.lm_head.weight"] = full["lm.model.embed_tokens.weight"]
            missing = set(policy.state_dict()) - set(full)
            if missing:
                raise WorkerError("config", f"{path} lacks weights {sorted(missing)[:5]}")
        set_model_state_dict(policy, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        del full
        return lm, policy

    def _checkpointing(self, lm, activation_checkpointing):
        if activation_checkpointing:
            # transformers >= 5.2x renamed it; 5.17 has only the old name
            if hasattr(lm, "activation_checkpointing_enable"):
                lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def _shard(self, policy, param_dtype):
        from torch.distributed.device_mesh import init_device_mesh

        fully_shard, MixedPrecisionPolicy = _fully_shard()
        mesh = init_device_mesh(self.device.type, (self.world,), mesh_dim_names=("dp",))
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for layer in policy.lm.model.layers:
            layer.float()
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        policy.float()
        # The root's float input is the inverse temperatures, which must stay f32 (1/0.7 is not a bf16).
        root_mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
        fully_shard(policy, mesh=mesh, mp_policy=root_mp)
        return policy

    def init(self, req, progress=None):
        """`init`: loads, shards and builds the optimiser (and the reference with `kl_ctl > 0`)."""
        path = req.get("model_path")
        if not isinstance(path, str):
            raise WorkerError("config", "init needs model_path")
        cfg_path = os.path.join(path, "config.json")
        try:
            raw = open(cfg_path, "rb").read()
            model_cfg = json.loads(raw)
        except (OSError, ValueError) as e:
            raise WorkerError("config", f"cannot read {cfg_path}: {e}") from None
        arch = model_cfg.get("model_type")
        if arch not in ARCHITECTURES:
            raise WorkerError("config", f"model_type {arch!r} is not one of {', '.join(ARCHITECTURES)}")
        train = parse_train_config(req.get("train"))
        param_dtype = req.get("param_dtype", "bf16" if self.device.type == "cuda" else "f32")
        if param_dtype not in DTYPES:
            raise WorkerError("config", f"param_dtype must be bf16 or f32, got {param_dtype!r}")
        if req.get("reduce_dtype", "f32") != "f32":
            raise WorkerError("config", f"reduce_dtype must be f32, got {req.get('reduce_dtype')!r}")
        chunk = req.get("logprob_chunk_tokens", 1024)
        if not (isinstance(chunk, int) and chunk >= 1):
            raise WorkerError("config", f"logprob_chunk_tokens must be an integer >= 1, got {chunk!r}")
        ac = req.get("activation_checkpointing", False)
        if not isinstance(ac, bool):
            raise WorkerError("config", f"activation_checkpointing must be true or false, got {ac!r}")
        seed = req.get("seed", 1)
        if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
            raise WorkerError("config", f"seed must be an integer >= 0, got {seed!r}")
        torch.manual_seed(seed)
        if self.policy is not None:
            # init again on a ready worker: the previous model, reference and optimiser go first
            self.policy = self.reference = self.optimizer = None
            self.model_info = None
            self.state = "new"
            self.steps = 0
            import gc

            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        if progress:
            progress("load", 0, 2)
        lm, policy = self._build(path, ac, DTYPES[param_dtype], chunk)
        lm.train()
        reference = None
        if train.ppo.kl_ctl > 0:
            if progress:
                progress("reference", 1, 2)
            ref_lm, reference = self._build(path, False, DTYPES[param_dtype], chunk)
            reference.requires_grad_(False)
            ref_lm.eval()
        a = train.adamw
        optimizer = torch.optim.AdamW(
            policy.parameters(),
            lr=train.schedule.lr_at(0),
            betas=(a.beta1, a.beta2),
            eps=a.eps,
            weight_decay=a.weight_decay,
        )
        self.policy, self.reference, self.optimizer, self.train = policy, reference, optimizer, train
        self.model_path = path
        self.param_dtype = param_dtype
        self.vocab = int(lm.config.vocab_size)
        self.config = model_cfg
        self.tied = bool(getattr(lm.config, "tie_word_embeddings", False))
        self.model_info = {
            "architecture": (model_cfg.get("architectures") or [""])[0],
            "config_sha256": hashlib.sha256(raw).hexdigest(),
            "parameters": sum(p.numel() for p in policy.parameters()),
        }
        self.steps = 0
        self.state = "ready"
        return {"model": self.model_info, "step": 0}

    def _need_ready(self):
        if self.state != "ready":
            raise WorkerError("protocol", f"the worker is {self.state}: call init first")

    # ---- steps ------------------------------------------------------------------------------------------

    def _inputs(self, p):
        d = self.device
        if p is None:  # padding: one token, one row, weight 0, so every rank runs the same collectives
            return (
                torch.zeros(1, dtype=torch.long, device=d),
                torch.zeros(1, dtype=torch.long, device=d),
                [(0, 1, 1)],
                torch.zeros(1, dtype=torch.long, device=d),
                torch.zeros(1, dtype=torch.long, device=d),
                torch.ones(1, dtype=torch.float32, device=d),
            )
        return (
            torch.tensor(p.tokens, dtype=torch.long, device=d),
            torch.tensor(p.positions, dtype=torch.long, device=d),
            p.runs,
            torch.tensor(p.rows, dtype=torch.long, device=d),
            torch.tensor(p.targets, dtype=torch.long, device=d),
            torch.tensor(p.inv_temperatures, dtype=torch.float32, device=d),
        )

    def _gather_tallies(self, tally):
        if self.world == 1:
            return tally
        out = [None] * self.world
        dist.all_gather_object(out, tally, group=self.obj_group)
        total = Tally()
        for t in out:
            total.merge(t)
        return total

    def step(self, kind, batch_path, step, progress=None, dump_gradients=None):
        """One optimiser step on a batch file: `grpo` (learner.rs `grpo_step`) or `sft` (`sft_step`).
        With `dump_gradients`, rank 0 also writes the batch's summed gradients (before clipping) there, by
        Hugging Face name in f32, for parity tests. `step=None` (benches) skips the check of the batch's step."""
        self._need_ready()
        started = time.perf_counter()
        b = read_batch(batch_path, self.vocab)
        if b.kind != kind:
            raise WorkerError("batch", f"the batch file is a {b.kind} batch, the call asked for {kind}")
        if step is not None and b.step != step:
            raise WorkerError("batch", f"the batch file is for step {b.step}, the call is step {step}")
        packs, (sequences, forward_tokens, micro) = micro_batches(b, self.train.max_tokens_per_mb, self.world, self.rank)
        tally = Tally()
        for i, p in enumerate(packs):
            if progress:
                progress("forward_backward", i, len(packs))
            if i == 1:
                self._injected_fault(step)
            if kind == "grpo":
                self._grpo_micro_batch(b, p, tally)
            else:
                self._sft_micro_batch(b, p, tally)
        if progress:
            progress("optimizer", len(packs), len(packs))
        if dump_gradients:
            self._dump_gradients(dump_gradients)
        lr, grad_norm = self._apply()
        tally = self._gather_tallies(tally)
        n = max(tally.tokens, 1)
        stats = {
            "step": self.steps,
            "loss": tally.loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "sequences": sequences,
            "tokens": tally.tokens,
            "forward_tokens": forward_tokens,
            "micro_batches": micro,
            "entropy": tally.entropy / n,
            "clip_fraction": 0.0,
            "dual_clip_fraction": 0.0,
            "approx_kl": 0.0,
            "ref_kl": None,
            "importance_weight": None,
            "behave_imp_weight": None,
            "behave_dropped_fraction": 0.0,
            "advantage": None,
            "staleness": None,
            "behave_logprob_drift": None,
            "behave_logprob_drift_truncated": None,
        }
        if kind == "grpo":
            stats.update(
                clip_fraction=tally.clipped / n,
                dual_clip_fraction=tally.dual_clipped / n,
                approx_kl=tally.log_ratio / n,
                ref_kl=tally.ref_kl / n if tally.has_ref else None,
                importance_weight=tally.ratio.finish(),
                behave_imp_weight=tally.behave.finish(),
                behave_dropped_fraction=tally.dropped / n,
                advantage=tally.adv.finish(),
                staleness=tally.staleness.finish(),
                behave_logprob_drift=tally.drift.finish(),
                behave_logprob_drift_truncated=tally.drift_truncated.finish(),
            )
        stats["seconds"] = time.perf_counter() - started
        return {"step": self.steps, "stats": stats}

    def _injected_fault(self, step):
        """Test hook: `ARENA_RL_TRAINER_FAULT=oom:RANK:STEP` raises an out-of-memory error on that rank at that
        step, after its first micro-batch (so the other ranks are inside collectives)."""
        fault = os.environ.get("ARENA_RL_TRAINER_FAULT", "")
        if fault.startswith("oom:"):
            _, rank, at = fault.split(":")
            if int(rank) == self.rank and int(at) == step:
                raise torch.OutOfMemoryError("injected by ARENA_RL_TRAINER_FAULT")

    def _forward(self, module, p):
        tokens, positions, runs, rows, targets, inv_t = self._inputs(p)
        out = module(tokens, positions, runs, rows, targets, inv_t)
        return out[:, 0], out[:, 1]

    def _backward(self, loss):
        # FSDP2 averages gradients over the data-parallel ranks; the batch's loss is the sum of every
        # rank's, so scale by the world size to get the single-process gradient (learner.rs sums
        # micro-batch gradients into one store).
        (loss * self.world if self.world > 1 else loss).backward()

    def _grpo_micro_batch(self, b, p, tally):
        """One micro-batch of learner.rs `grpo_gradients`: loss.rs `ppo_loss` forward and backward, and the
        per-token tally."""
        ppo = self.train.ppo
        logp, ent = self._forward(self.policy, p)
        ref_logp = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logp, _ = self._forward(self.reference, p)
            self.reference.reshard()
        if p is None:
            self._backward((logp.sum() + ent.sum()) * 0.0)
            return
        idx = np.array([j for _, j in p.origin], dtype=np.int64)
        seqs = np.array([s for s, _ in p.origin], dtype=np.int64)
        d = self.device
        behave = b.logprobs[idx]
        logp_host = logp.detach().float().cpu().numpy()
        # learner.rs: the proximal policy is this pass's weights (detached), or the behaviour's.
        prox = logp_host.copy() if ppo.recomputes() else behave.copy()
        if ppo.use_decoupled_loss:
            bw = behaviour_weight(prox, behave, ppo.behav_imp_weight_cap)
        else:
            bw = np.ones(len(idx), dtype=np.float32)
        adv = b.advantages[seqs]
        weight = b.weights[seqs]
        t = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(d)  # noqa: E731
        prox_t = logp.detach() if ppo.recomputes() else t(prox)
        # loss.rs `ppo_loss`: (pg * behaviour weight + kl_ctl * KL - entropy_coeff * H) * weight, summed.
        total = clipped_pg(logp, prox_t, t(adv), ppo) * t(bw)
        if ref_logp is not None and ppo.kl_ctl > 0:
            total = total + kl_estimate(logp - ref_logp, ppo.kl_estimator) * ppo.kl_ctl
        if ppo.entropy_coeff > 0:
            total = total - ent * ppo.entropy_coeff
        loss = (total * t(weight)).sum()
        self._backward(loss)
        tally.loss += float(loss.detach())
        # learner.rs `grpo_gradients`'s tally, vectorised; f32 differences widened to f64 as there.
        a = adv.astype(np.float64)
        log_ratio = (logp_host - prox).astype(np.float32).astype(np.float64)
        ratio = np.exp(log_ratio)
        high = ppo.eps_clip_higher if ppo.eps_clip_higher is not None else ppo.eps_clip
        l1 = -a * ratio
        l2 = -a * np.clip(ratio, 1.0 - ppo.eps_clip, 1.0 + high)
        tally.tokens += len(idx)
        tally.clipped += int((l1 < l2).sum())
        if ppo.c_clip is not None:
            tally.dual_clipped += int((ppo.c_clip * np.abs(a) < np.maximum(l1, l2)).sum())
        tally.log_ratio += float(log_ratio.sum())
        tally.ratio.push_all(ratio)
        tally.entropy += float(ent.detach().float().cpu().numpy().astype(np.float64).sum())
        tally.adv.push_all(a)
        if ppo.use_decoupled_loss:
            tally.dropped += int((bw == 0).sum())
            tally.behave.push_all(bw[bw != 0].astype(np.float64))
        if ref_logp is not None:
            tally.has_ref = True
            r = ref_logp.float().cpu().numpy()
            tally.ref_kl += float(kl_estimate((logp_host - r).astype(np.float32).astype(np.float64), ppo.kl_estimator).sum())
        v = b.versions[idx]
        pv = b.policy_version
        tally.staleness.push_all((pv - v[v >= 0]).astype(np.float64))
        # stats.rs: tokens sampled under this step's version must match this pass's log-probability.
        same = v == pv
        drift = np.abs(behave - logp_host).astype(np.float32).astype(np.float64)
        trunc = b.truncated[idx] != 0
        tally.drift.push_all(drift[same & ~trunc])
        tally.drift_truncated.push_all(drift[same & trunc])

    def _sft_micro_batch(self, b, p, tally):
        """One micro-batch of learner.rs `sft_step`: loss.rs `sft_loss`, `-sum w_t logp_t`."""
        logp, ent = self._forward(self.policy, p)
        if p is None:
            self._backward((logp.sum() + ent.sum()) * 0.0)
            return
        seqs = np.array([s for s, _ in p.origin], dtype=np.int64)
        w = torch.from_numpy(np.ascontiguousarray(b.weights[seqs])).to(self.device)
        loss = -(logp * w).sum()
        self._backward(loss)
        tally.loss += float(loss.detach())
        tally.tokens += p.trained()
        tally.entropy += float(ent.detach().float().cpu().numpy().astype(np.float64).sum())

    def _dump_gradients(self, path):
        from safetensors.torch import save_file

        out = {}
        for name, p in self.policy.named_parameters():
            hf = name[len("lm.") :] if name.startswith("lm.") else name
            g = p.grad
            if g is None:
                continue
            full = g.full_tensor() if hasattr(g, "full_tensor") else g
            if self.rank == 0:
                out[hf] = full.detach().float().cpu().contiguous()
        if self.rank == 0:
            tmp = path + ".tmp"
            save_file(out, tmp)
            os.replace(tmp, path)

    def _apply(self):
        """learner.rs `apply`: the global norm of the summed gradients (optim.rs `GradStore::clip`, the rule
        of `clip_grad_norm_`), clipping, and one AdamW step at `schedule.lr_at(steps)`."""
        params = [p for p in self.policy.parameters() if p.grad is not None]
        local = [
            (g.to_local() if hasattr(g, "to_local") else g).float().pow(2).sum().double() for g in (p.grad for p in params)
        ]
        sq = torch.stack(local).sum() if local else torch.zeros((), dtype=torch.float64, device=self.device)
        if self.world > 1:
            dist.all_reduce(sq)
        norm = math.sqrt(float(sq))
        max_norm = self.train.gradient_clipping
        if max_norm > 0:
            factor = max_norm / (norm + 1e-6)
            if factor < 1.0:
                for p in params:
                    p.grad.mul_(factor)
        lr = self.train.schedule.lr_at(self.steps)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return lr, norm

    # ---- publish / save / load --------------------------------------------------------------------------

    def _hf_items(self):
        """(Hugging Face name, sharded tensor) of the policy, without the tied output projection."""
        for name, t in self.policy.state_dict().items():
            hf = name[len("lm.") :] if name.startswith("lm.") else name
            if self.tied and hf == "lm_head.weight":
                continue
            yield hf, t

    def publish(self, path, dtype, progress=None, max_shard_bytes=None):
        """`publish`: a Hugging Face folder in `dtype` (safetensors shards of at most `max_shard_bytes`,
        default SHARD_BYTES, with an index; config, tokenizer files), written under `<path>.tmp` and renamed;
        rank 0 writes, every rank gathers."""
        from safetensors.torch import save_file

        self._need_ready()
        if dtype not in DTYPES:
            raise WorkerError("config", f"publish dtype must be bf16 or f32, got {dtype!r}")
        started = time.perf_counter()
        target = DTYPES[dtype]
        items = list(self._hf_items())
        size = torch.tensor([], dtype=target).element_size()
        shards, cur, cur_bytes = [], [], 0
        for name, t in items:
            nbytes = t.numel() * size
            if cur and cur_bytes + nbytes > (max_shard_bytes or SHARD_BYTES):
                shards.append(cur)
                cur, cur_bytes = [], 0
            cur.append(name)
            cur_bytes += nbytes
        if cur:
            shards.append(cur)
        tmp = path + ".tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        by_name = dict(items)
        weight_map, total, files = {}, 0, []
        for i, names in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            tensors = {}
            for name in names:
                t = by_name[name]
                full = t.full_tensor() if hasattr(t, "full_tensor") else t
                if self.rank == 0:
                    tensors[name] = full.detach().to(target).cpu().contiguous()
                    total += tensors[name].numel() * size
                    weight_map[name] = fname
                del full
            if progress:
                progress("publish", i, len(shards))
            if self.rank == 0:
                save_file(tensors, os.path.join(tmp, fname), metadata={"format": "pt"})
                files.append(fname)
        if self.rank == 0:
            with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
            cfg = dict(self.config)
            cfg["dtype"] = {"bf16": "bfloat16", "f32": "float32"}[dtype]
            if "torch_dtype" in cfg:
                cfg["torch_dtype"] = cfg["dtype"]
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f, indent=2)
            for name in TOKENIZER_FILES:
                src = os.path.join(self.model_path, name)
                if os.path.isfile(src):
                    shutil.copyfile(src, os.path.join(tmp, name))
                    files.append(name)
            if os.path.exists(path):
                shutil.rmtree(path)
            os.replace(tmp, path)
        dist.barrier(group=self.obj_group)
        return {
            "path": path,
            "files": len(files) + 2,
            "bytes": total,
            "seconds": time.perf_counter() - started,
        }

    def _state(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.policy, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def save(self, path, progress=None):
        """`save`: sharded model and optimiser state with torch.distributed.checkpoint, plus trainer.json,
        written under `<path>.tmp` and renamed."""
        import torch.distributed.checkpoint as dcp

        self._need_ready()
        started = time.perf_counter()
        tmp = path + ".tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        dist.barrier(group=self.obj_group)
        dcp.save(self._state(), checkpoint_id=tmp)
        dist.barrier(group=self.obj_group)
        if self.rank == 0:
            with open(os.path.join(tmp, "trainer.json"), "w") as f:
                json.dump(
                    {
                        "protocol": PROTOCOL,
                        "step": self.steps,
                        "model": self.model_info,
                        "world_size": self.world,
                    },
                    f,
                    indent=2,
                )
            if os.path.exists(path):
                shutil.rmtree(path)
            os.replace(tmp, path)
        dist.barrier(group=self.obj_group)
        return {"path": path, "seconds": time.perf_counter() - started}

    def load(self, path, progress=None):
        """`load`: restores a `save`d state, at any world size; the model must be the one `init` loaded."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        self._need_ready()
        meta_path = os.path.join(path, "trainer.json")
        try:
            meta = json.load(open(meta_path))
        except (OSError, ValueError) as e:
            raise WorkerError("path", f"cannot read {meta_path}: {e}") from None
        saved = (meta.get("model") or {}).get("config_sha256")
        if saved != self.model_info["config_sha256"]:
            raise WorkerError(
                "config",
                f"checkpoint {path} is of a model with config sha256 {saved}, the worker loaded {self.model_info['config_sha256']}",
            )
        state = self._state()
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.policy, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.steps = int(meta["step"])
        return {"step": self.steps}
