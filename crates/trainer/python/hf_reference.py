"""Reference data from Hugging Face transformers for the trainer crate's parity tests.

Usage: hf_reference.py JOB.json OUT_DIR

JOB.json holds:
  model:   a Hugging Face folder to read (and to create first when `make` is given)
  make:    optional {arch, config, seed, std, dtype, max_shard_size}: build a random model of that
           transformers config class, perturb its norms and biases so they are not trivially 1 and 0,
           and save it to `model`
  logits:  optional list of {name, rows: [[ids]], padding: "right" | "left"}
  greedy:  optional list of {name, input_ids, max_new_tokens}
  chat:    optional {messages, max_new_tokens}: render with the folder's chat template, then greedy;
           the prompt's logits go to chat.f32

OUT_DIR receives result.json and one little-endian float32 file per logits case (NAME.f32, shape
[batch, len, vocab]; padded positions included, the caller compares valid ones).
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

CLASSES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def make(spec, out):
    torch.manual_seed(spec.get("seed", 0))
    config = CLASSES[spec["arch"]](**spec["config"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    std = spec.get("std", 0.2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, std)
            else:
                p.normal_(0.0, std)
        model.tie_weights()
    model = model.to(DTYPES[spec.get("dtype", "f32")])
    model.save_pretrained(out, max_shard_size=spec.get("max_shard_size", "5GB"))


def padded(rows, left, pad_id):
    width = max(len(r) for r in rows)
    ids, mask = [], []
    for r in rows:
        pad = [pad_id] * (width - len(r))
        ids.append(pad + r if left else r + pad)
        m = [0] * (width - len(r))
        ones = [1] * len(r)
        mask.append(m + ones if left else ones + m)
    return torch.tensor(ids), torch.tensor(mask)


def main():
    job_path, out_dir = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    torch.set_grad_enabled(False)
    if "make" in job:
        make(job["make"], job["model"])
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    model.eval()
    result = {"logits": {}, "greedy": {}}
    for case in job.get("logits", []):
        ids, mask = padded(case["rows"], case.get("padding") == "left", 0)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
        logits = logits.to(torch.float32).contiguous()
        logits.numpy().astype("<f4").tofile(os.path.join(out_dir, case["name"] + ".f32"))
        result["logits"][case["name"]] = list(logits.shape)
    gen = model.generation_config
    gen.eos_token_id = None
    gen.pad_token_id = 0
    for case in job.get("greedy", []):
        ids = torch.tensor([case["input_ids"]])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=case["max_new_tokens"],
            do_sample=False,
            generation_config=gen,
        )
        result["greedy"][case["name"]] = out[0, ids.shape[1] :].tolist()
    if "chat" in job:
        tok = AutoTokenizer.from_pretrained(job["model"])
        prompt = tok.apply_chat_template(job["chat"]["messages"], add_generation_prompt=True, tokenize=False)
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        eos = tok.convert_tokens_to_ids(tok.eos_token)
        gen.eos_token_id = eos
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=job["chat"]["max_new_tokens"],
            do_sample=False,
            generation_config=gen,
        )
        new = out[0, ids.shape[1] :].tolist()
        logits = model(input_ids=ids).logits.to(torch.float32).contiguous()
        logits.numpy().astype("<f4").tofile(os.path.join(out_dir, "chat.f32"))
        result["chat"] = {
            "prompt_ids": ids[0].tolist(),
            "completion_ids": new,
            "eos_token_id": eos,
            "text": tok.decode(new, skip_special_tokens=True),
        }
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
