"""The GPU program's stages (issue 29 point 7), one per call; each prints one JSON object.

  bench.py make MODEL DIR                 random-weight MODEL (qwen3-1.7b, qwen3-4b, tiny) saved as an HF folder
  bench.py inprocess DIR RUN TOKENS...    the engine's own step function, no server: tokens/s, MFU, peak memory
                                          per packed size, then the seconds to publish a bf16 folder
  bench.py protocol DIR RUN TOKENS...     the same steps through arena-rl-trainer/1: the worker under torchrun,
                                          driven by this file's Python client (the Rust `drive` example is the
                                          other driver, see program.sh)

Every step packs TOKENS tokens as 4 sequences of TOKENS/4 (the second half of each trained) into one
micro-batch, with activation checkpointing, bf16 compute and f32 master weights and reductions on CUDA.
"""

import json
import os
import secrets
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from arena_rl_fsdp2.testing import QWEN3, make_model, token_mean_weights, write_batch  # noqa: E402

TINY = os.environ.get("ARENA_RL_FSDP2_GPU_TINY") == "1"
STEPS = int(os.environ.get("ARENA_RL_FSDP2_GPU_STEPS", "3"))  # the first is warm-up
PEAK_FLOPS = float(os.environ.get("ARENA_RL_FSDP2_PEAK_FLOPS", "989e12"))  # H200 dense bf16, the spec sheet
SHAPES = dict(QWEN3, tiny={"tie_word_embeddings": True, "head_dim": 16})


def cuda():
    return torch.cuda.is_available() and not TINY


def train_config(max_tokens):
    return {
        "schedule": {"lr": 1e-6, "kind": "constant", "warmup_steps": 0, "total_steps": 100, "min_lr_ratio": 0.0},
        "adamw": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
        "gradient_clipping": 1.0,
        "max_tokens_per_mb": max_tokens,
        "aggregation": "token-mean",
        "ppo": {
            "eps_clip": 0.2, "eps_clip_higher": None, "c_clip": None, "use_decoupled_loss": True,
            "recompute_logprob": False, "behav_imp_weight_cap": 5.0, "kl_ctl": 0.0, "kl_estimator": "k1",
            "entropy_coeff": 0.0, "adv_norm": None, "temperature": 1.0,
        },
    }


def init_request(model_dir, max_tokens):
    return {
        "model_path": model_dir,
        "train": train_config(max_tokens),
        "total_steps": 100,
        "param_dtype": "bf16" if cuda() else "f32",
        "reduce_dtype": "f32",
        "activation_checkpointing": True,
        "logprob_chunk_tokens": 1024 if not TINY else 64,
        "seed": 1,
    }


def make_batch(path, vocab, tokens, step, seed):
    rng = np.random.default_rng(seed)
    n = tokens // 4
    seqs = []
    for i in range(4):
        mask = np.zeros(n, dtype=np.uint8)
        mask[n // 2 :] = 1
        seqs.append({
            "tokens": rng.integers(0, vocab, n).tolist(),
            "loss_mask": mask.tolist(),
            "logprobs": (-rng.uniform(0.1, 3.0, n)).astype(np.float32).tolist(),
            "versions": [step if m else -1 for m in mask],
            "temperatures": [1.0] * n,
            "advantage": 1.0 if i % 2 == 0 else -1.0,
        })
    write_batch(path, token_mean_weights(seqs), step=step, policy_version=step, group_sizes=[4])
    return path


def flops_per_token(cfg, seq_len):
    """PaLM's count: 6 x the matmul parameters (the output projection included, tied or not) plus causal
    attention, 6 x layers x heads x head_dim x seq_len / 2 x 2 (QK and PV), forward and backward; activation
    recompute is not counted (MFU, not hardware utilisation)."""
    h, L, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    per_layer = h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 3 * h * inter
    matmul = L * per_layer + h * cfg["vocab_size"]
    return 6 * matmul + 6 * L * nh * hd * seq_len


def cmd_make(model, path):
    t = time.perf_counter()
    shape = dict(SHAPES[model])
    dtype = torch.bfloat16 if cuda() else torch.float32
    make_model("qwen3", path, seed=0, dtype=dtype, device="cuda" if cuda() else "cpu", **shape)
    if cuda():
        torch.cuda.empty_cache()
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return {"stage": "make", "model": model, "path": path, "bytes": size, "seconds": time.perf_counter() - t}


def cmd_inprocess(model_dir, run, token_sizes):
    from arena_rl_fsdp2.engine import Engine

    t0 = time.perf_counter()
    eng = Engine()
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    eng.init(init_request(model_dir, max(token_sizes)))
    out = {"stage": "inprocess", "model_dir": model_dir, "init_seconds": time.perf_counter() - t0,
           "device": torch.cuda.get_device_name() if cuda() else "cpu", "torch": torch.__version__,
           "parameters": eng.model_info["parameters"], "peak_flops": PEAK_FLOPS, "sizes": []}
    os.makedirs(f"{run}/batches", exist_ok=True)
    step = 0
    for tokens in token_sizes:
        if cuda():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for k in range(STEPS):
            b = make_batch(f"{run}/batches/inproc-{step}.safetensors", cfg["vocab_size"], tokens, step, step)
            t = time.perf_counter()
            r = eng.step("grpo", b, step)
            if cuda():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            step += 1
        timed = times[1:] or times
        sec = sum(timed) / len(timed)
        fpt = flops_per_token(cfg, tokens // 4)
        out["sizes"].append({
            "tokens": tokens, "seq_len": tokens // 4, "step_seconds": timed, "warmup_seconds": times[0],
            "tokens_per_second": tokens / sec, "flops_per_token": fpt, "mfu": fpt * tokens / sec / PEAK_FLOPS,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda() else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda() else None,
            "loss": r["stats"]["loss"], "grad_norm": r["stats"]["grad_norm"],
        })
        print(json.dumps(out["sizes"][-1]), file=sys.stderr, flush=True)
    p = eng.publish(f"{run}/weights/inproc-bf16", "bf16")
    out["publish_bf16"] = p
    return out


def cmd_protocol(model_dir, run, token_sizes):
    from arena_rl_fsdp2.client import Client

    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    key = secrets.token_hex(16)
    port = 18000 + secrets.randbelow(2000)
    env = dict(os.environ, ARENA_RL_TRAINER_API_KEY=key, PYTHONPATH=os.path.dirname(HERE))
    if not cuda():
        env["ARENA_RL_TRAINER_DEVICE"] = "cpu"
    os.makedirs(f"{run}/batches", exist_ok=True)
    log = open(f"{run}/worker.log", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
         "-m", "arena_rl_fsdp2", "--listen", f"127.0.0.1:{port}", "--run-dir", run],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        c = Client(f"127.0.0.1:{port}", key=key, poll_s=0.01)
        c.wait_ready(proc=proc)
        started = time.perf_counter() - t0
        hello = c.hello()
        t = time.perf_counter()
        c.call("init", init_request(model_dir, max(token_sizes)))
        out = {"stage": "protocol", "driver": "python client (arena_rl_fsdp2.client)", "start_seconds": started,
               "init_seconds": time.perf_counter() - t, "hello": hello, "peak_flops": PEAK_FLOPS, "sizes": []}
        step = 0
        for tokens in token_sizes:
            times, worker = [], []
            for k in range(STEPS):
                b = make_batch(f"{run}/batches/step-{step}.safetensors", cfg["vocab_size"], tokens, step, step)
                t = time.perf_counter()
                r = c.step(step, "grpo", b)
                times.append(time.perf_counter() - t)
                worker.append(r["stats"]["seconds"])
                step += 1
            timed = times[1:] or times
            sec = sum(timed) / len(timed)
            fpt = flops_per_token(cfg, tokens // 4)
            out["sizes"].append({
                "tokens": tokens, "step_seconds": timed, "worker_step_seconds": worker[1:] or worker,
                "tokens_per_second": tokens / sec, "mfu": fpt * tokens / sec / PEAK_FLOPS,
                "protocol_overhead_seconds": sec - sum(worker[1:] or worker) / len(worker[1:] or worker),
            })
            print(json.dumps(out["sizes"][-1]), file=sys.stderr, flush=True)
        t = time.perf_counter()
        out["publish_bf16"] = dict(c.call("publish", {"path": f"{run}/weights/proto-bf16", "dtype": "bf16"}),
                                   client_seconds=time.perf_counter() - t)
        return out
    except BaseException:
        log.flush()
        print(open(f"{run}/worker.log").read()[-4000:], file=sys.stderr)
        raise
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


def main():
    what = sys.argv[1]
    if what == "make":
        res = cmd_make(sys.argv[2], sys.argv[3])
    elif what == "inprocess":
        res = cmd_inprocess(sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4:]])
    elif what == "protocol":
        res = cmd_protocol(sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4:]])
    else:
        raise SystemExit(f"unknown stage {what}")
    print(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
