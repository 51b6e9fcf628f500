"""Dev check: bad batch files are refused with one `batch` error naming the field, sequence and token."""
import os, sys, copy
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
from safetensors.numpy import save_file
from arena_rl_fsdp2.batch import read_batch
from arena_rl_fsdp2.errors import WorkerError
from arena_rl_fsdp2.testing import random_sequences, write_batch
from arena_rl_fsdp2 import PROTOCOL
work = sys.argv[1]
rng = np.random.default_rng(0)
good = random_sequences(rng, 256, [6, 9])
def case(name, seqs=None, tweak=None, meta=None):
    p = f"{work}/bad.safetensors"
    write_batch(p, seqs or good)
    if tweak or meta:
        from safetensors import safe_open
        with safe_open(p, "numpy") as f:
            t = {k: f.get_tensor(k) for k in f.keys()}; m = dict(f.metadata())
        if tweak: tweak(t)
        if meta: m.update(meta)
        save_file(t, p, metadata=m)
    try:
        read_batch(p, 256); print(f"{name}: ACCEPTED (wrong)")
    except WorkerError as e:
        print(f"{name}: {e.kind}: {e.message}")
s = copy.deepcopy(good); s[1]["tokens"][4] = 300; case("token out of vocab", s)
s = copy.deepcopy(good); s[1]["loss_mask"][0] = 1; case("mask[0]", s)
s = copy.deepcopy(good); s[0]["logprobs"][4] = 0.5; case("positive logprob", s)
s = copy.deepcopy(good); s[0]["temperatures"][4] = -1; case("negative temperature", s)
case("offsets", tweak=lambda t: t.__setitem__("offsets", np.array([0, 6, 14], dtype=np.int64)))
case("dtype", tweak=lambda t: t.__setitem__("tokens", t["tokens"].astype(np.int64)))
case("missing", tweak=lambda t: t.pop("weights"))
case("nan advantage", tweak=lambda t: t.__setitem__("advantages", np.array([np.nan, 1], dtype=np.float32)))
case("group sizes", tweak=lambda t: t.__setitem__("group_sizes", np.array([3], dtype=np.int64)))
case("protocol", meta={"protocol": "arena-rl-trainer/0"})
case("kind", meta={"kind": "ppo"})
s = copy.deepcopy(good)
for q in s: q["loss_mask"] = [0] * len(q["tokens"])
p = write_batch(f"{work}/empty.safetensors", s)
from arena_rl_fsdp2.batch import micro_batches
try:
    micro_batches(read_batch(p, 256), 100, 1, 0); print("no trained token: ACCEPTED (wrong)")
except WorkerError as e:
    print("no trained token:", e.kind, e.message)
