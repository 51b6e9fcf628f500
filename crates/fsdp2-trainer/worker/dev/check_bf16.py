"""Dev check of the GPU's mixed-precision path on the CPU: bf16 compute, f32 masters and reductions.
Run: torchrun --standalone --nproc-per-node N dev/check_bf16.py WORKDIR"""
import os, sys, json
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("ARENA_RL_TRAINER_DEVICE", "cpu")
from arena_rl_fsdp2.engine import Engine
work = sys.argv[1]
e = Engine()
e.init({"model_path": f"{work}/qwen3", "train": {"max_tokens_per_mb": 40, "ppo": {"use_decoupled_loss": True, "kl_ctl": 0.1, "entropy_coeff": 0.01}},
        "param_dtype": "bf16", "activation_checkpointing": True, "logprob_chunk_tokens": 8})
print({p.dtype for p in e.policy.parameters()})
for s in range(2):
    r = e.step("grpo", f"{work}/batch-{s}.safetensors", s)
    if e.rank == 0:
        st = r["stats"]; print(s, st["loss"], st["grad_norm"], st["entropy"], st["importance_weight"], st["ref_kl"])
p = e.publish(f"{work}/pub-bf16-{e.world}", "bf16")
if e.rank == 0: print(p)
