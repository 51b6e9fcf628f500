"""Dev check: one GRPO step (and an SFT step) with the in-process engine; dumps gradients and stats.
Run: torchrun --standalone --nproc-per-node N dev/check_engine.py ARCH WORKDIR TAG"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("ARENA_RL_TRAINER_DEVICE", "cpu")
from arena_rl_fsdp2.engine import Engine  # noqa: E402

arch, work, tag = sys.argv[1:4]
eng = Engine()
train = {
    "schedule": {"lr": 1e-3, "kind": "constant", "warmup_steps": 0, "total_steps": 10, "min_lr_ratio": 0.0},
    "adamw": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
    "gradient_clipping": 1.0,
    "max_tokens_per_mb": 40,
    "aggregation": "token-mean",
    "ppo": {"eps_clip": 0.2, "eps_clip_higher": 0.28, "c_clip": 3.0, "use_decoupled_loss": True, "recompute_logprob": True,
            "behav_imp_weight_cap": 5.0, "kl_ctl": 0.1, "kl_estimator": "k3", "entropy_coeff": 0.01, "adv_norm": None, "temperature": 1.0},
}
eng.init({"model_path": f"{work}/{arch}", "train": train, "param_dtype": "f32", "logprob_chunk_tokens": 7,
          "activation_checkpointing": os.environ.get("AC") == "1"})
out = {}
for step in range(3):
    r = eng.step("grpo", f"{work}/batch-{step}.safetensors", step, dump_gradients=f"{work}/grads-{arch}-{tag}-{step}.safetensors")
    out[f"grpo{step}"] = r
sft = eng.step("sft", f"{work}/sft-3.safetensors", 3)
out["sft"] = sft
eng.publish(f"{work}/pub-{arch}-{tag}", "f32")
eng.save(f"{work}/ckpt-{arch}-{tag}")
if eng.rank == 0:
    json.dump(out, open(f"{work}/stats-{arch}-{tag}.json", "w"), indent=1)
    print(json.dumps(out["grpo0"]["stats"], indent=1))
