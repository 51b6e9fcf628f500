import os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from arena_rl_fsdp2.testing import make_model, random_sequences, write_batch, token_mean_weights
work = sys.argv[1]
for arch in ("llama", "qwen2", "qwen3"):
    make_model(arch, f"{work}/{arch}", seed=1, tie_word_embeddings=(arch == "qwen3"))
rng = np.random.default_rng(0)
for step in range(3):
    seqs = random_sequences(rng, 256, [5, 9, 17, 33, 50, 12, 8], version=step)
    write_batch(f"{work}/batch-{step}.safetensors", seqs, step=step, policy_version=step, group_sizes=[4, 3])
sft = [{"tokens": rng.integers(0, 256, n).tolist(), "loss_mask": [0, 0] + [1] * (n - 2)} for n in (6, 20, 45)]
write_batch(f"{work}/sft-3.safetensors", token_mean_weights(sft), kind="sft", step=3)
