"""PyTorch's side of the `trainer_step` bench: the same GRPO training step on the same model, on the CPU.

Usage: bench_train.py MODEL_DIR

Reads one workload per line on stdin, {name, batch, seq_len, prompt_len, repeats}, and answers each with one
line on stdout, {name, seconds, tokens_per_second, torch_threads, loss}: the median of `repeats` timed steps
after one warm-up step, with torch on one thread and on all cores, whichever is faster.

The step is the trainer's: sequences of `seq_len` deterministic tokens whose last `seq_len - prompt_len` tokens
are trained, behaviour log-probabilities of -8.3, advantages +1 and -1 alternately; the hidden states of the
positions that predict a trained token go through the output projection; PPO-clip (eps 0.2) averaged over
trained tokens; backward; gradient-norm clipping at 1.0; one AdamW step (lr 1e-3, weight decay 0.01 on every
parameter). Tokens per second counts every token of the batch.
"""

import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM

ALL_THREADS = torch.get_num_threads()


def batch(b, seq_len, vocab):
    return torch.tensor([[((s * seq_len + i) * 7919) % vocab for i in range(seq_len)] for s in range(b)])


def main():
    model_dir = sys.argv[1]
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    state = {k: v.clone() for k, v in base.state_dict().items()}
    vocab = base.config.vocab_size
    for line in sys.stdin:
        w = json.loads(line)
        b, seq_len, prompt = w["batch"], w["seq_len"], w["prompt_len"]
        ids = batch(b, seq_len, vocab)
        targets = ids[:, prompt:]
        behave = torch.full(targets.shape, -8.3)
        adv = torch.tensor([1.0 if s % 2 == 0 else -1.0 for s in range(b)]).unsqueeze(1).expand_as(behave)

        def fresh():
            base.load_state_dict(state)
            base.train()
            return torch.optim.AdamW(base.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

        def step(opt):
            hidden = base.model(input_ids=ids).last_hidden_state
            logits = base.lm_head(hidden[:, prompt - 1 : seq_len - 1])
            logp = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            ratio = torch.exp(logp - behave)
            loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(base.parameters(), 1.0)
            opt.step()
            return loss.item()

        best = None
        for threads in sorted({1, ALL_THREADS}):
            torch.set_num_threads(threads)
            opt = fresh()
            step(opt)
            times = []
            for _ in range(w["repeats"]):
                start = time.perf_counter()
                loss = step(opt)
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            if best is None or median < best[0]:
                best = (median, threads, loss)
        median, threads, loss = best
        answer = {
            "name": w["name"],
            "seconds": median,
            "tokens_per_second": b * seq_len / median,
            "torch_threads": threads,
            "loss": loss,
        }
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
