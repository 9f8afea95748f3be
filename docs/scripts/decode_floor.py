#!/usr/bin/env python3
"""docs/scripts/decode_floor.py — the memory-bandwidth floor of one decoding step, the table of
docs/decoding.md.

A decoding step attends N_q = 1 new query row per head to the whole KV cache. A key and its value
(4d bytes at fp16) serve the H / H_kv query heads of their group, 4d FLOPs each: H / H_kv FLOPs per
byte, where an H100 does ~300 fp16 tensor-core FLOPs per byte of HBM bandwidth. So the step is
bound by memory: it cannot finish before K and V have streamed through once,
bytes = 2 (K and V) * B * H_kv * N_kv * d * 2 bytes (fp16). Q and O (B * H * d each) are
too small to matter and are left out. The floor is bytes / bandwidth, here 3.35 TB/s (an H100
SXM's HBM3 as specified; measured copies reach less).

    python3 docs/scripts/decode_floor.py            # prints the Markdown table
    python3 docs/scripts/decode_floor.py --tbps 4.8 # another bandwidth (an H200: 4.8 TB/s)
"""
import argparse
import itertools

BYTES_FP16 = 2


def kv_bytes(batch, heads_kv, seq_kv, dim):
    """Bytes of K and V read once: the cache of every (batch, KV head)."""
    return 2 * batch * heads_kv * seq_kv * dim * BYTES_FP16


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tbps", type=float, default=3.35, help="memory bandwidth, TB/s")
    args = parser.parse_args()
    heads = 32
    print(f"| B | H | H_kv | N_kv | d | K + V bytes | floor at {args.tbps} TB/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch, heads_kv, seq_kv, dim in itertools.product(
        (1, 8), (8, 32), (8192, 32768, 131072), (64, 128)
    ):
        nbytes = kv_bytes(batch, heads_kv, seq_kv, dim)
        micros = nbytes / (args.tbps * 1e12) * 1e6
        print(
            f"| {batch} | {heads} | {heads_kv} | {seq_kv} | {dim} | {nbytes / 2**20:.0f} MiB "
            f"| {micros:.1f} µs |"
        )


if __name__ == "__main__":
    main()
