"""Dev check: the packed, chunked log-probabilities and entropies equal a plain Hugging Face forward of each
sequence alone (world of one, CPU)."""
import os, sys
import numpy as np, torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("ARENA_RL_TRAINER_DEVICE", "cpu")
from arena_rl_fsdp2.engine import Engine
from arena_rl_fsdp2.batch import read_batch, micro_batches
from transformers import AutoModelForCausalLM
work, arch = sys.argv[1:3]
eng = Engine()
eng.init({"model_path": f"{work}/{arch}", "train": {"max_tokens_per_mb": 40}, "param_dtype": "f32", "logprob_chunk_tokens": 5})
b = read_batch(f"{work}/batch-0.safetensors", eng.vocab)
packs, _ = micro_batches(b, 40, 1, 0)
ref = AutoModelForCausalLM.from_pretrained(f"{work}/{arch}", dtype=torch.float32, attn_implementation="eager")
worst = 0
with torch.no_grad():
    for p in packs:
        logp, ent = eng._forward(eng.policy, p)
        for i, (s, j) in enumerate(p.origin):
            o = int(b.offsets[s]); t = j - o
            z = ref(torch.tensor(b.tokens[o:o + t][None], dtype=torch.long)).logits[0, -1].double() * p.inv_temperatures[i]
            lp = torch.log_softmax(z, -1)
            worst = max(worst, abs(float(lp[b.tokens[j]]) - float(logp[i])), abs(float(-(lp.exp() * lp).sum()) - float(ent[i])))
print(arch, "worst |diff| logp/entropy vs HF eager per sequence:", worst)
