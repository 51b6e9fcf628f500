"""transformers' side of the `trainer_generate` bench: the same workloads on the same model, on the CPU.

Usage: bench_generate.py MODEL_DIR

Reads one workload per line on stdin, {name, batch, prompt_len, new_tokens, repeats}, and answers each with
one line on stdout, {name, seconds, tokens_per_second, torch_threads}: the median of `repeats` timed runs
after one warm-up run, with torch on one thread and on all cores, whichever is faster (on a busy machine
torch's spinning worker threads can make the multi-threaded run several times slower). Prompts are deterministic token ids; generation is greedy without early stops.
The bench sends workloads one at a time and measures burn between them, so both sides see the same load.
"""

import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def prompts(batch, prompt_len, vocab):
    return torch.tensor([[(7 * b + 13 * t + 1) % vocab for t in range(prompt_len)] for b in range(batch)])


ALL_THREADS = torch.get_num_threads()


def main():
    model_dir = sys.argv[1]
    torch.set_grad_enabled(False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    gen = model.generation_config
    gen.eos_token_id = None
    gen.pad_token_id = 0
    vocab = model.config.vocab_size
    for line in sys.stdin:
        w = json.loads(line)
        ids = prompts(w["batch"], w["prompt_len"], vocab)
        mask = torch.ones_like(ids)

        def run():
            return model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=w["new_tokens"],
                min_new_tokens=w["new_tokens"],
                do_sample=False,
                generation_config=gen,
            )

        best = None
        for threads in sorted({1, ALL_THREADS}):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                run()
                times = []
                for _ in range(w["repeats"]):
                    start = time.perf_counter()
                    out = run()
                    times.append(time.perf_counter() - start)
            assert out.shape == (w["batch"], w["prompt_len"] + w["new_tokens"])
            median = statistics.median(times)
            if best is None or median < best[0]:
                best = (median, threads)
        median, threads = best
        tokens = w["batch"] * (w["new_tokens"] if w["new_tokens"] > 1 else w["prompt_len"])
        answer = {
            "name": w["name"],
            "seconds": median,
            "tokens_per_second": tokens / median,
            "torch_threads": threads,
        }
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
