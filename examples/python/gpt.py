#!/usr/bin/env python3
"""examples/python/gpt.py — a small character-level GPT trained twice, on the same text, the same
initial weights and the same batches: once with flashattn.attention (forward and backward through
flashattn's own kernels, via torch.autograd), once with PyTorch's scaled_dot_product_attention.
The two loss curves must agree within float32 noise; the script prints both, the largest
difference, each run's tokens/s, and writes a CSV (docs/scripts/plot_gpt.py draws it).

The text is this repository's own documentation (README.md and docs/*.md) unless --text names a
file. --device cuda runs both on the GPU (flashattn in float32 on cuda-fa2, in place).

Usage:
  PYTHONPATH=build/release/python python3 examples/python/gpt.py [--steps 300] [--csv out.csv]
      [--backend omp] [--threads N] [--layers 2] [--heads 4] [--embd 64] [--block 64] [--batch 16]
"""
import argparse
import csv
import glob
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_text(path):
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read()
    files = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    return "\n".join(open(f, encoding="utf-8").read() for f in files)


class Attention(nn.Module):
    """Causal multi-head self-attention; `kind` picks who computes softmax(QK^T/sqrt(d)) V."""

    def __init__(self, embd, heads, kind, backend, attn_dtype):
        super().__init__()
        self.heads, self.kind, self.backend, self.attn_dtype = heads, kind, backend, attn_dtype
        self.qkv = nn.Linear(embd, 3 * embd)
        self.proj = nn.Linear(embd, embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2).to(self.attn_dtype)
                   for t in (q, k, v))  # the attention alone in --attn-dtype, both kinds
        if self.kind == "flashattn":
            y = flashattn.attention(q, k, v, causal=True, backend=self.backend)
        elif self.kind == "sdpa-math":  # PyTorch's other implementation (--noise)
            with sdpa_kernel(SDPBackend.MATH):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.to(x.dtype).transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, embd, heads, kind, backend, attn_dtype):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(embd), nn.LayerNorm(embd)
        self.attn = Attention(embd, heads, kind, backend, attn_dtype)
        self.mlp = nn.Sequential(nn.Linear(embd, 4 * embd), nn.GELU(), nn.Linear(4 * embd, embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, embd, heads, layers, kind, backend, attn_dtype):
        super().__init__()
        self.tok = nn.Embedding(vocab, embd)
        self.pos = nn.Embedding(block, embd)
        self.blocks = nn.Sequential(*[Block(embd, heads, kind, backend, attn_dtype)
                                       for _ in range(layers)])
        self.ln = nn.LayerNorm(embd)
        self.head = nn.Linear(embd, vocab, bias=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        logits = self.head(self.ln(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def train(kind, data, val, vocab, a):
    torch.manual_seed(a.seed)  # the same initial weights for both kinds
    model = GPT(vocab, a.block, a.embd, a.heads, a.layers, kind, a.backend,
                getattr(torch, a.attn_dtype)).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    batches = torch.Generator().manual_seed(a.seed + 1)  # the same batches too
    losses, start = [], time.perf_counter()
    for step in range(a.steps):
        ix = torch.randint(len(data) - a.block - 1, (a.batch,), generator=batches)
        x = torch.stack([data[i:i + a.block] for i in ix]).to(a.device)
        y = torch.stack([data[i + 1:i + 1 + a.block] for i in ix]).to(a.device)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # (also waits for the GPU, so the timing is honest)
        if step % a.every == 0 or step == a.steps - 1:
            print(f"  {kind:9s} step {step:4d}  loss {loss.item():.4f}", flush=True)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        gen = torch.Generator().manual_seed(a.seed + 2)
        ix = torch.randint(len(val) - a.block - 1, (64,), generator=gen)
        x = torch.stack([val[i:i + a.block] for i in ix]).to(a.device)
        y = torch.stack([val[i + 1:i + 1 + a.block] for i in ix]).to(a.device)
        val_loss = model(x, y).item()
    return losses, a.steps * a.batch * a.block / seconds, val_loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", help="training text (default: the repository's README and docs)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=64, help="context length (tokens)")
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--attn-dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                    help="precision of the attention alone (q, k, v cast to it, the output cast "
                         "back); the rest of the model stays float32")
    ap.add_argument("--backend", help="flashattn backend with a backward pass (default: omp on "
                                      "the CPU; on CUDA cuda-fa2 in float32, cuda-tc in "
                                      "float16/bfloat16)")
    ap.add_argument("--threads", type=int, default=0,
                    help="PyTorch's threads (0: its default); flashattn's are OMP_NUM_THREADS's")
    ap.add_argument("--every", type=int, default=50, help="print the loss every N steps")
    ap.add_argument("--csv", help="write step, loss_flashattn, loss_sdpa (and loss_sdpa_math) to "
                                  "this file")
    ap.add_argument("--noise", action="store_true",
                    help="also train with PyTorch's MATH attention (same seed and batches): how far "
                         "two correct implementations drift apart is the yardstick; flashattn "
                         "must stay within 2x of it (+0.01)")
    a = ap.parse_args()
    for name in ("steps", "batch", "block", "embd", "heads", "layers", "every"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if a.embd % a.heads:
        ap.error(f"--embd ({a.embd}) must be a multiple of --heads ({a.heads})")
    info = {b["name"]: b for b in flashattn.backend_info()}
    a.backend = a.backend or ("omp" if a.device == "cpu" else
                              "cuda-fa2" if a.attn_dtype == "float32" else "cuda-tc")
    ok = a.backend in info and info[a.backend]["backward"] and (
        info[a.backend]["device"] == "cpu" if a.device == "cpu" else info[a.backend]["device_arrays"])
    if not ok:
        ap.error(f"--backend {a.backend}: needs a backward pass and, for --device cuda, a device "
                 "entry (cuda-fa2 in float32, cuda-tc in float16/bfloat16)")
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # both runs in real float32
        torch.backends.cudnn.allow_tf32 = False
    if a.threads:
        torch.set_num_threads(a.threads)

    text = load_text(a.text)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    encoded = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(encoded))
    data, val = encoded[:split], encoded[split:]
    if len(val) <= a.block + 1:
        ap.error("the text is too short for this --block")
    print(f"text: {len(text)} characters, vocabulary {len(chars)}; model: {a.layers} layers, "
          f"{a.heads} heads, d_model {a.embd} (d = {a.embd // a.heads}), context {a.block}, "
          f"batch {a.batch}; {a.device} ({torch.get_num_threads()} threads); flashattn backend "
          f"{a.backend}; attention in {a.attn_dtype}")

    kinds = ("flashattn", "sdpa") + (("sdpa-math",) if a.noise else ())
    results = {kind: train(kind, data, val, len(chars), a) for kind in kinds}
    (ours, ours_tps, ours_val), (theirs, theirs_tps, theirs_val) = results["flashattn"], results["sdpa"]
    worst = max(abs(x - y) for x, y in zip(ours, theirs))
    print(f"flashattn: {ours_tps:9.0f} tokens/s, final train loss {ours[-1]:.4f}, val loss {ours_val:.4f}")
    print(f"sdpa:      {theirs_tps:9.0f} tokens/s, final train loss {theirs[-1]:.4f}, val loss {theirs_val:.4f}")
    print(f"largest |loss difference| over {a.steps} steps: {worst:.2e}")
    # Agreement: the two runs differ only in the attention's rounding (in --attn-dtype), which
    # training carries forward. Without a yardstick, 0.05; with --noise, within 2x of how far
    # PyTorch's own two attentions drift apart (+0.01). A real divergence is a bug.
    bound = 0.05
    if a.noise:
        math_losses, math_tps, math_val = results["sdpa-math"]
        noise = max(abs(x - y) for x, y in zip(math_losses, theirs))
        bound = 2 * noise + 0.01
        print(f"sdpa MATH: {math_tps:9.0f} tokens/s, final train loss {math_losses[-1]:.4f}, "
              f"val loss {math_val:.4f}")
        print(f"largest |sdpa - sdpa MATH| (the yardstick): {noise:.2e}; bound 2x + 0.01 = {bound:.2e}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "loss_flashattn", "loss_sdpa"] + (["loss_sdpa_math"] if a.noise else []))
            columns = [range(a.steps), ours, theirs] + ([results["sdpa-math"][0]] if a.noise else [])
            w.writerows(zip(*columns))
        print(f"wrote {a.csv}")
    return 0 if worst <= bound and math.isfinite(ours[-1]) else 1


if __name__ == "__main__":
    sys.exit(main())
