"""The policy as FSDP2 shards it: a Hugging Face causal LM inside a small root module whose forward runs the
decoder over one packed row and returns the log-probability and entropy of each trained token.

- Attention over a packed row: a Hugging Face attention function (`arena_packed`) that runs causal
  `scaled_dot_product_attention` per sequence (runs of equal-length sequences as one batched call), so no
  token attends across a sequence boundary and no `tokens x tokens` mask is built; positions restart at 0
  in every sequence. This is what crates/trainer/src/train/forward.rs and chunked.rs compute.
- The output projection in chunks of rows with recompute in the backward pass (torch.utils.checkpoint per
  chunk), so a step never holds `tokens x vocab` logits: crates/trainer/src/train/chunked.rs
  (`logp_forward`: logits scaled by each row's inverse temperature, log-sum-exp, target log-probability,
  entropy `lse - sum p z`).
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

ATTN = "arena_packed"
ARCHITECTURES = ("llama", "qwen2", "qwen3")


def packed_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Causal attention within each sequence of a packed row; `arena_runs` lists `(start, len, count)`."""
    runs = kwargs.get("arena_runs")
    b, h, t, d = query.shape
    hkv = key.shape[1]
    if runs is None:
        runs = [(0, t, 1)]
    outs = []
    for start, n, c in runs:
        span = slice(start, start + c * n)

        def split(x, heads):
            # [1, heads, c*n, d] -> [c, heads, n, d]
            return x[:, :, span].reshape(heads, c, n, d).transpose(0, 1)

        q, k, v = split(query, h), split(key, hkv), split(value, hkv)
        if hkv != h:
            # grouped key/value heads expanded, so every backend (flash attention on CUDA) takes them
            k = k[:, :, None].expand(c, hkv, h // hkv, n, d).reshape(c, h, n, d)
            v = v[:, :, None].expand(c, hkv, h // hkv, n, d).reshape(c, h, n, d)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
        # [c, h, n, d] -> [1, c*n, h, d]
        outs.append(o.transpose(1, 2).reshape(1, c * n, h, d))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return out, None


def register():
    """Registers `arena_packed` with transformers (attention only: no mask is built for it)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN, packed_attention)


def _chunk_logp(h, w, targets, inv_t):
    """chunked.rs `logp_forward` for one chunk: `[log p(target), entropy]` at the rows' temperatures (f32)."""
    z = (h @ w.t()).float() * inv_t.float()[:, None]
    m = z.max(dim=1, keepdim=True).values
    lse = m + (z - m).exp().sum(dim=1, keepdim=True).log()
    logp = z.gather(1, targets[:, None]) - lse
    p = (z - lse).exp()
    entropy = lse - (p * z).sum(dim=1, keepdim=True)
    return torch.cat([logp, entropy], dim=1)


class Policy(torch.nn.Module):
    """The root module FSDP2 shards last: `lm` is the Hugging Face model (its decoder layers sharded one by
    one); `forward` returns `[N, 2]` (log-probability, entropy) of the trained tokens of one packed row."""

    def __init__(self, lm, logits_chunk=1024):
        super().__init__()
        self.lm = lm
        self.logits_chunk = logits_chunk

    def forward(self, tokens, positions, runs, rows, targets, inv_t):
        out = self.lm.model(input_ids=tokens[None], position_ids=positions[None], use_cache=False, arena_runs=runs)
        x = out.last_hidden_state[0]
        h = x.index_select(0, rows)
        w = self.lm.get_output_embeddings().weight
        n = h.shape[0]
        chunk = max(1, self.logits_chunk)
        parts = []
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            if torch.is_grad_enabled():
                parts.append(checkpoint(_chunk_logp, h[s:e], w, targets[s:e], inv_t[s:e], use_reentrant=False))
            else:
                parts.append(_chunk_logp(h[s:e], w, targets[s:e], inv_t[s:e]))
        if not parts:
            return torch.zeros((0, 2), dtype=torch.float32, device=x.device)
        return parts[0] if len(parts) == 1 else torch.cat(parts, 0)
