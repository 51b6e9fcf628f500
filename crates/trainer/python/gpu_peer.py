"""PyTorch's side of the GPU program (`gpu_figures.sh`): the model, the reference logits and the peer's figures.

Usage:
  gpu_peer.py make-model DIR        random-initialise a Qwen3-0.6B-shaped model (f32) into DIR, plus DIR/probe.json
                                    with 64 token ids and transformers' logits for them in f32 and in bf16
  gpu_peer.py train DIR             one GRPO step on 8 x 2048 tokens in bf16 autocast, the trainer's step
  gpu_peer.py long DIR              the same on one 16384-token sequence
  gpu_peer.py decode DIR            greedy decoding tokens/s at batch 1, 16 and 64 (32 prompt, 128 new tokens)

Each prints one JSON object. The step is the trainer's (as in bench_train.py): deterministic tokens, the last
seven eighths trained, behaviour log-probabilities of -8.3, advantages +1 and -1 alternately, PPO-clip (eps
0.2) averaged over trained tokens, gradient-norm clipping at 1.0, one AdamW step.
"""

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

DEVICE = "cuda"
BF16_PEAK_FLOPS = 989e12


def qwen3_0_6b():
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        hidden_act="silu",
        torch_dtype="float32",
    )


def make_model(out):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3_0_6b(), torch_dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    model = model.to(DEVICE).eval()
    tokens = [(i * 7919) % 151936 for i in range(64)]
    ids = torch.tensor([tokens], device=DEVICE)
    with torch.no_grad():
        f32 = model(input_ids=ids).logits[0].float().cpu().flatten().tolist()
        bf16 = model.to(torch.bfloat16)(input_ids=ids).logits[0].float().cpu().flatten().tolist()
    with open(f"{out}/probe.json", "w") as f:
        json.dump({"tokens": tokens, "logits_f32": f32, "logits_bf16": bf16}, f)
    params = sum(p.numel() for p in model.parameters())
    return {"stage": "make-model", "parameters": params}


def step_figures(model_dir, b, seq_len, steps):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(DEVICE)
    model.train()
    vocab = model.config.vocab_size
    prompt = seq_len // 8
    ids = torch.tensor([[((s * seq_len + i) * 7919) % vocab for i in range(seq_len)] for s in range(b)], device=DEVICE)
    targets = ids[:, prompt:]
    behave = torch.full(targets.shape, -8.3, device=DEVICE)
    adv = torch.tensor([1.0 if s % 2 == 0 else -1.0 for s in range(b)], device=DEVICE).unsqueeze(1).expand_as(behave)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hidden = model.model(input_ids=ids).last_hidden_state
            logits = model.lm_head(hidden[:, prompt - 1 : seq_len - 1])
        logp = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp - behave)
        loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    params = sum(p.numel() for p in model.parameters())
    tokens = b * seq_len
    return {
        "sequences": b,
        "seq_len": seq_len,
        "step_seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "mfu": 6 * params * tokens / seconds / BF16_PEAK_FLOPS,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
    }


def decode(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(DEVICE).eval()
    vocab = model.config.vocab_size
    rates = {}
    for b in (1, 16, 64):
        ids = torch.tensor([[(t * 31 + i * 7) % vocab for t in range(32)] for i in range(b)], device=DEVICE)
        for timed in (False, True):
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=128, min_new_tokens=128, do_sample=False)
            torch.cuda.synchronize()
            if timed:
                rates[str(b)] = (out.shape[1] - 32) * b / (time.perf_counter() - start)
    return {"new_tokens": 128, "prompt_tokens": 32, "tokens_per_second": rates}


def main():
    stage, model_dir = sys.argv[1], sys.argv[2]
    if stage == "make-model":
        out = make_model(model_dir)
    elif stage == "train":
        out = {"stage": "train", **step_figures(model_dir, 8, 2048, 3)}
    elif stage == "long":
        out = {"stage": "long", **step_figures(model_dir, 1, 16384, 1)}
    elif stage == "decode":
        out = {"stage": "decode", **decode(model_dir)}
    else:
        raise SystemExit(f"unknown stage {stage}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
