"""Helpers for tests, benches and the GPU program: random-weight models from a config, and batch files in
the protocol's format (docs/trainer-protocol.md, "The batch file")."""

import json
import os

import numpy as np
import torch

from . import PROTOCOL

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
}

# The published shapes (config.json of Qwen/Qwen3-1.7B and Qwen/Qwen3-4B on the Hugging Face hub).
QWEN3 = {
    "qwen3-1.7b": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "qwen3-4b": {
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
}


def make_config(arch, **shape):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    kw = dict(TINY)
    kw.update(shape)
    theta = kw.pop("rope_theta", None)
    cfg = cls(**kw)
    if theta is not None:
        if getattr(cfg, "rope_parameters", None) is not None:
            cfg.rope_parameters["rope_theta"] = theta
        else:
            cfg.rope_theta = theta
    return cfg


def make_model(arch, path, seed=0, dtype=torch.float32, device="cpu", **shape):
    """A random-weight model of `arch` saved as a Hugging Face folder at `path`; returns its config."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = make_config(arch, **shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    del model
    return cfg


def write_batch(path, sequences, kind="grpo", step=0, policy_version=0, group_sizes=()):
    """Writes a batch file. Each sequence is a dict with `tokens` and `loss_mask`, and optionally
    `logprobs`, `versions`, `temperatures`, `truncated` (per token), `advantage` and `weight`."""
    from safetensors.numpy import save_file

    def cat(key, dtype, default):
        return np.concatenate([np.asarray(s.get(key, [default] * len(s["tokens"])), dtype=dtype) for s in sequences])

    offsets = np.cumsum([0] + [len(s["tokens"]) for s in sequences]).astype(np.int64)
    tensors = {
        "tokens": cat("tokens", np.int32, 0),
        "loss_mask": cat("loss_mask", np.uint8, 0),
        "logprobs": cat("logprobs", np.float32, 0.0),
        "versions": cat("versions", np.int64, -1),
        "temperatures": cat("temperatures", np.float32, 1.0),
        "truncated": cat("truncated", np.uint8, 0),
        "offsets": offsets,
        "advantages": np.asarray([s.get("advantage", 0.0) for s in sequences], dtype=np.float32),
        "weights": np.asarray([s.get("weight", 0.0) for s in sequences], dtype=np.float32),
        "group_sizes": np.asarray(list(group_sizes), dtype=np.int64),
    }
    meta = {"protocol": PROTOCOL, "kind": kind, "step": str(step), "policy_version": str(policy_version)}
    save_file(tensors, path, metadata=meta)
    return path


def token_mean_weights(sequences):
    """loss.rs `token_weights` for token-mean: `1 / N` on every trained token."""
    n = sum(int(np.sum(s["loss_mask"])) for s in sequences)
    for s in sequences:
        s["weight"] = float(np.float32(1.0 / n)) if np.sum(s["loss_mask"]) else 0.0
    return sequences


def random_sequences(rng, vocab, lengths, prompt=3, version=0):
    """GRPO sequences with a prompt of `prompt` tokens, behaviour log-probabilities, temperatures 0, 0.7 and
    1, some truncated tokens and stale versions; advantages alternate in sign."""
    out = []
    for i, n in enumerate(lengths):
        mask = np.zeros(n, dtype=np.uint8)
        mask[min(prompt, n - 1) :] = 1
        if n > prompt + 4:
            mask[prompt + 2] = 0  # a tool token inside the trajectory
        out.append(
            {
                "tokens": rng.integers(0, vocab, n).tolist(),
                "loss_mask": mask.tolist(),
                "logprobs": (-rng.uniform(0.5, 6.0, n)).astype(np.float32).tolist(),
                "versions": [version - (i % 2) if m else -1 for m in mask],
                "temperatures": [[0.0, 0.7, 1.0][(i + t) % 3] for t in range(n)],
                "truncated": [(t % 5 == 0) for t in range(n)],
                "advantage": float((-1) ** i * (0.5 + 0.1 * i)),
            }
        )
    return token_mean_weights(out)


def json_dump(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
