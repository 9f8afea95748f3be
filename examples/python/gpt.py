#!/usr/bin/env python3
"""examples/python/gpt.py — a small character-level GPT trained twice, on the same text, the same
initial weights and the same batches: once with flashattn.attention (forward and backward through
flashattn's own kernels, via torch.autograd), once with PyTorch's scaled_dot_product_attention.
The two loss curves must agree within float32 noise; the script prints both, the largest
difference, each run's tokens/s, and writes a CSV (docs/scripts/plot_gpt.py draws it).

The text is this repository's own documentation (README.md and docs/*.md) unless --text names a
file. --device cuda runs both on the GPU (flashattn in place, on PyTorch's stream).

As a benchmark: --preset gpu is a GPT-2-small-sized model (12 layers, d_model 768, 12 heads of
d = 64, context 1024) trained in bfloat16 autocast on the GPU; --compile wraps both models in
torch.compile(fullgraph=True). Each run is timed after --warmup steps (compilation and first-use
setup stay out), and the script prints tokens/s and peak GPU memory (torch.cuda.max_memory_allocated
over the run's steps, less the other models' weights, gradients and optimizer state) of both,
then a markdown row for docs/python.md. The preset interleaves the two models (--interleave 10:
turns of 10 timed steps each), so that a host whose speed drifts slows both alike, and prints the
ratio of every round's turns as well.

Usage:
  PYTHONPATH=build/release/python python3 examples/python/gpt.py [--steps 300] [--csv out.csv]
      [--backend omp] [--threads N] [--layers 2] [--heads 4] [--embd 64] [--block 64] [--batch 16]
  PYTHONPATH=build/gpu/python python3 examples/python/gpt.py --preset gpu [--compile]
      [--autocast none]        # float32 instead of bfloat16 autocast
      [--profile 3]            # then where each run's device time goes (torch.profiler)
"""
import argparse
import contextlib
import csv
import glob
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import flashattn

# --preset gpu: GPT-2 small's shape (12 layers, d_model 768, 12 heads, context 1024) in bfloat16
# autocast; any option given on the command line wins over these.
PRESETS = {
    "gpu": dict(device="cuda", layers=12, embd=768, heads=12, block=1024, batch=8, steps=210,
                warmup=10, interleave=10, every=50, lr=6e-4, autocast="bfloat16",
                attn_dtype="auto"),
}

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
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.attn_dtype is None:
            y = self.attend(q, k, v)
        else:  # the attention alone in --attn-dtype, both kinds: under autocast, flashattn's
            # attention and SDPA both cast float32 inputs to autocast's dtype, so it is off here
            with torch.autocast(x.device.type, enabled=False):
                y = self.attend(*(t.to(self.attn_dtype) for t in (q, k, v)))
        return self.proj(y.to(x.dtype).transpose(1, 2).contiguous().view(B, T, C))

    def attend(self, q, k, v):
        if self.kind == "flashattn":
            return flashattn.attention(q, k, v, causal=True, backend=self.backend)
        if self.kind == "sdpa-math":  # PyTorch's other implementation (--noise)
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


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


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def print_profile(kind, train_step, a):
    """Runs a.profile more steps under torch.profiler and prints the operators and kernels that
    took the most device time (CPU time on the CPU), per step."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(a.profile):
            train_step()
        synchronize(a.device)
    key = "self_cuda_time_total" if a.device == "cuda" else "self_cpu_time_total"
    print(f"profile of {kind}, {a.profile} steps (times are totals over them):")
    print(prof.key_averages().table(sort_by=key, row_limit=a.profile_rows))


class Run:
    """One model's training: the model (seeded, so that every kind starts from the same weights),
    its optimizer, its batches (seeded alike: every kind sees the same ones) and its losses."""

    def __init__(self, kind, data, vocab, a, others=()):
        self.kind, self.data, self.a = kind, data, a
        # The models already built (--interleave) hold their weights, gradients and optimizer
        # state while this one warms up: this run's peak is counted without them (but with what
        # the process keeps from their steps, such as cuBLAS's workspace, as the first run's peak
        # counts it too).
        self.others = others
        if a.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(a.seed)  # the same initial weights for every kind
        attn_dtype = None if a.attn_dtype == "auto" else getattr(torch, a.attn_dtype)
        self.model = GPT(vocab, a.block, a.embd, a.heads, a.layers, kind, a.backend,
                         attn_dtype).to(a.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=a.lr)
        self.step_model = torch.compile(self.model, fullgraph=True) if a.compile else self.model
        self.autocast = (torch.autocast(a.device, dtype=getattr(torch, a.autocast))
                         if a.autocast != "none" else contextlib.nullcontext())
        self.batches = torch.Generator().manual_seed(a.seed + 1)  # the same batches too
        self.losses = []  # loss tensors: reading each would wait for the GPU at every step
        self.peak = None

    def batch(self, rows):
        """A batch on the device. On a GPU it is copied from pinned memory, as a DataLoader with
        pin_memory=True does: a copy from pageable memory may wait for the GPU's queued work, and
        the step would then run behind the host instead of ahead of it."""
        rows = torch.stack(rows)
        if self.a.device == "cuda":
            rows = rows.pin_memory()
        return rows.to(self.a.device, non_blocking=True)

    def step(self):
        a, data = self.a, self.data
        ix = torch.randint(len(data) - a.block - 1, (a.batch,), generator=self.batches)
        x = self.batch([data[i:i + a.block] for i in ix])
        y = self.batch([data[i + 1:i + 1 + a.block] for i in ix])
        with self.autocast:
            loss = self.step_model(x, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.losses.append(loss.detach())
        if (len(self.losses) - 1) % a.every == 0 or len(self.losses) == a.steps:
            print(f"  {self.kind:9s} step {len(self.losses) - 1:4d}  loss "
                  f"{self.losses[-1].item():.4f}", flush=True)

    def resident_bytes(self):
        """Bytes of the model's weights, gradients and optimizer state."""
        tensors = [p for p in self.model.parameters()]
        tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
        tensors += [t for state in self.opt.state.values() for t in state.values()
                    if isinstance(t, torch.Tensor) and t.device.type == "cuda"]
        return sum(t.numel() * t.element_size() for t in tensors)

    def note_peak(self):
        """The peak GPU memory since the last reset_peak_memory_stats, without the other models'
        resident bytes, into self.peak (the largest so far); resets the statistics."""
        if self.a.device != "cuda":
            return
        synchronize(self.a.device)
        peak = torch.cuda.max_memory_allocated() - sum(o.resident_bytes() for o in self.others)
        self.peak = peak if self.peak is None else max(self.peak, peak)
        torch.cuda.reset_peak_memory_stats()

    def warm_up(self):
        """The --warmup steps (compilation, first-use setup), and their peak memory."""
        for _ in range(self.a.warmup):
            self.step()
        self.note_peak()

    def finish(self, val):
        """(losses, validation loss); the run's profile first where --profile asks for one."""
        a = self.a
        if a.profile:  # after the timed steps, so that the profiler's cost stays out of tokens/s
            print_profile(self.kind, self.step, a)
        with torch.no_grad(), self.autocast:
            gen = torch.Generator().manual_seed(a.seed + 2)
            ix = torch.randint(len(val) - a.block - 1, (min(64, 8 * a.batch),), generator=gen)
            x = torch.stack([val[i:i + a.block] for i in ix]).to(a.device)
            y = torch.stack([val[i + 1:i + 1 + a.block] for i in ix]).to(a.device)
            val_loss = self.model(x, y).item()
        return torch.stack(self.losses[:a.steps]).tolist(), val_loss


def timed(run, steps):
    """Seconds that `steps` steps of `run` take, from an idle GPU to an idle GPU; their peak memory
    goes into run.peak (after the timing)."""
    synchronize(run.a.device)
    if run.a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        run.step()
    synchronize(run.a.device)
    seconds = time.perf_counter() - start
    run.note_peak()
    return seconds


def train(kinds, data, val, vocab, a):
    """Trains one model per kind; returns {kind: (losses, tokens/s over the steps after --warmup,
    validation loss, peak GPU memory in bytes or None)} and the ratios of the rounds (below).

    One after the other by default. With --interleave N, all models are built and warmed up, then
    take turns of N steps each (the kind that goes first alternating), each turn timed alone: a
    host whose speed drifts over seconds (the GPT-sized models here wait on the host) then slows
    every kind alike, and each round gives a ratio flashattn / sdpa of its own."""
    tokens_per_step = a.batch * a.block
    timed_steps = a.steps - a.warmup
    results, rounds = {}, []
    if not a.interleave:
        for kind in kinds:
            run = Run(kind, data, vocab, a)
            run.warm_up()
            seconds = timed(run, timed_steps)
            losses, val_loss = run.finish(val)
            results[kind] = (losses, timed_steps * tokens_per_step / seconds, val_loss, run.peak)
            del run
            if a.device == "cuda":
                torch.cuda.empty_cache()
        return results, rounds
    runs = []
    for kind in kinds:
        runs.append(Run(kind, data, vocab, a, others=tuple(runs)))
        runs[-1].warm_up()
    for run in runs:  # from now on every other model is resident during a run's turns
        run.others = tuple(other for other in runs if other is not run)
    seconds = {run.kind: 0.0 for run in runs}
    done = 0
    while done < timed_steps:
        n = min(a.interleave, timed_steps - done)
        turn = {run.kind: timed(run, n) for run in runs}
        for kind, t in turn.items():
            seconds[kind] += t
        rounds.append(turn["sdpa"] / turn["flashattn"])  # (tokens/s)_flashattn / (tokens/s)_sdpa
        runs.reverse()  # the other kind goes first next round
        done += n
    for run in runs:
        losses, val_loss = run.finish(val)
        results[run.kind] = (losses, timed_steps * tokens_per_step / seconds[run.kind], val_loss,
                             run.peak)
    return results, rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS),
                    help="gpu: 12 layers, d_model 768, 12 heads, context 1024, batch 8, bfloat16 "
                         "autocast, 210 steps of which 10 warm-up, the models interleaved in "
                         "turns of 10 steps (options given still win)")
    ap.add_argument("--text", help="training text (default: the repository's README and docs)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=0,
                    help="steps left out of tokens/s (compilation, first-use setup)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=64, help="context length (tokens)")
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--autocast", default="none", choices=["none", "bfloat16", "float16"],
                    help="train under torch.autocast in this dtype (both kinds)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile(model, fullgraph=True), both kinds")
    ap.add_argument("--attn-dtype", default="auto",
                    choices=["auto", "float32", "float16", "bfloat16"],
                    help="precision of the attention alone (q, k, v cast to it, autocast off "
                         "around it, the output cast back), both kinds; the rest of the model as "
                         "--autocast says. auto (default): as q, k, v come, float32 without "
                         "--autocast, its dtype under it (where both kinds cast float32 inputs "
                         "to it)")
    ap.add_argument("--backend", help="flashattn backend with a backward pass (default: omp on "
                                      "the CPU; on CUDA the fastest for the device and dtype)")
    ap.add_argument("--threads", type=int, default=0,
                    help="PyTorch's threads (0: its default); flashattn's are OMP_NUM_THREADS's")
    ap.add_argument("--every", type=int, default=50, help="print the loss every N steps")
    ap.add_argument("--interleave", type=int, default=0, metavar="N",
                    help="build every model first, then let them take turns of N timed steps "
                         "each, and print the ratio of each round too: a host whose speed drifts "
                         "slows both alike (0: one model after the other)")
    ap.add_argument("--csv", help="write step, loss_flashattn, loss_sdpa (and loss_sdpa_math) to "
                                  "this file")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the timed steps, run N more of each kind under torch.profiler and "
                         "print the operators and kernels that took the most time")
    ap.add_argument("--profile-rows", type=int, default=25, help="rows of each --profile table")
    ap.add_argument("--noise", action="store_true",
                    help="also train with PyTorch's MATH attention (same seed and batches): how far "
                         "two correct implementations drift apart is the yardstick; flashattn "
                         "must stay within 2x of it (+0.01)")
    a = ap.parse_args()
    if a.preset:  # the preset's values for the options not given on the command line
        ap.set_defaults(**PRESETS[a.preset])
        a = ap.parse_args()
    for name in ("steps", "batch", "block", "embd", "heads", "layers", "every"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if a.interleave < 0:
        ap.error("--interleave must be at least 0")
    if a.profile < 0 or a.profile_rows < 1:
        ap.error("--profile must be at least 0 and --profile-rows at least 1")
    if not 0 <= a.warmup < a.steps:
        ap.error(f"--warmup ({a.warmup}) must be in [0, --steps)")
    if a.embd % a.heads:
        ap.error(f"--embd ({a.embd}) must be a multiple of --heads ({a.heads})")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: PyTorch sees no CUDA device")
    info = {b["name"]: b for b in flashattn.backend_info()}
    a.backend = a.backend or ("omp" if a.device == "cpu" else None)  # CUDA: flashattn's default
    if a.backend is not None:
        ok = a.backend in info and info[a.backend]["backward"] and (
            info[a.backend]["device"] == "cpu" if a.device == "cpu"
            else info[a.backend]["device_arrays"])
        if not ok:
            ap.error(f"--backend {a.backend}: needs a backward pass and, for --device cuda, a "
                     "device entry (cuda-fa2 in float32, cuda-tc in float16/bfloat16)")
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
    where = (torch.cuda.get_device_name() if a.device == "cuda"
             else f"cpu ({torch.get_num_threads()} threads)")
    precision = (f"{a.autocast} autocast" if a.autocast != "none" else "float32") + (
        f", attention in {a.attn_dtype}" if a.attn_dtype != "auto" else "")
    print(f"text: {len(text)} characters, vocabulary {len(chars)}; model: {a.layers} layers, "
          f"{a.heads} heads, d_model {a.embd} (d = {a.embd // a.heads}), context {a.block}, "
          f"batch {a.batch}; {where}; flashattn backend {a.backend or 'default'}; {precision}"
          f"{'; torch.compile' if a.compile else ''}; torch {torch.__version__}")

    kinds = ("flashattn", "sdpa") + (("sdpa-math",) if a.noise else ())
    results, rounds = train(kinds, data, val, len(chars), a)
    (ours, ours_tps, ours_val, ours_peak) = results["flashattn"]
    (theirs, theirs_tps, theirs_val, theirs_peak) = results["sdpa"]
    worst = max(abs(x - y) for x, y in zip(ours, theirs))

    def memory(peak):
        return "" if peak is None else f", peak memory {peak / 2**20:8.0f} MiB"

    print(f"flashattn: {ours_tps:9.0f} tokens/s{memory(ours_peak)}, final train loss "
          f"{ours[-1]:.4f}, val loss {ours_val:.4f}")
    print(f"sdpa:      {theirs_tps:9.0f} tokens/s{memory(theirs_peak)}, final train loss "
          f"{theirs[-1]:.4f}, val loss {theirs_val:.4f}")
    print(f"flashattn / sdpa: {ours_tps / theirs_tps:.2f}x tokens/s (steps {a.warmup}..{a.steps - 1})")
    if rounds:
        ordered = sorted(rounds)
        print(f"interleaved: {len(rounds)} rounds of {a.interleave} steps each; the rounds' ratios "
              f"median {statistics.median(rounds):.2f}, lowest {ordered[0]:.2f}, highest "
              f"{ordered[-1]:.2f}")
    print(f"largest |loss difference| over {a.steps} steps: {worst:.2e}")
    mib = (lambda p: "-" if p is None else f"{p / 2**20:,.0f}")  # noqa: E731
    print("markdown row (docs/python.md):")
    print("| model | precision | compile | flashattn tokens/s | SDPA tokens/s | ratio | "
          "flashattn peak MiB | SDPA peak MiB |")
    print(f"| {a.layers} layers, d_model {a.embd}, {a.heads} heads (d = {a.embd // a.heads}), "
          f"context {a.block}, batch {a.batch} | {precision} | {'yes' if a.compile else 'no'} | "
          f"{ours_tps:,.0f} | {theirs_tps:,.0f} | {ours_tps / theirs_tps:.2f} | "
          f"{mib(ours_peak)} | {mib(theirs_peak)} |")
    # Agreement: the two runs differ only in the attention's rounding (in --attn-dtype), which
    # training carries forward. Without a yardstick, 0.05; with --noise, within 2x of how far
    # PyTorch's own two attentions drift apart (+0.01). A real divergence is a bug.
    bound = 0.05
    if a.noise:
        math_losses, math_tps, math_val, _ = results["sdpa-math"]
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
