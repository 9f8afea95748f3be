#!/usr/bin/env python3
"""cuda/tools/decode_tiles.py — cuda-tc's decoding tile shapes side by side at decoding shapes,
beside cuDNN: each shape forced with FLASHATTN_VARIANT=cuda-tc=<name> and timed as
compare_decode.py --graph times (calls captured in a CUDA graph over K/V copies larger than L2),
fp16, µs per call. How the default decoding shape of each head dim was chosen (docs/decoding.md).

  PYTHONPATH=build/gpu/python python3 cuda/tools/decode_tiles.py [--repeat 20] [--dim 64|128]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_decode import ours_graph, torch_ms  # noqa: E402

# The compiled decoding shapes per head dim (cuda/tc/forward.cu), the default first.
TILES = {128: ["decode-w4-Bc64-s2", "decode-w4-Bc64-s3", "decode-w8-Bc128-s3"],
         64: ["decode-w4-Bc128-s3", "decode-w4-Bc64-s4"]}
SHAPES = [(1, 32, 8, 1, 8192, 128), (1, 32, 8, 1, 8192, 64), (1, 32, 32, 1, 8192, 128),
          (1, 32, 8, 1, 32768, 128), (8, 32, 32, 1, 8192, 64), (8, 32, 8, 1, 8192, 64),
          (1, 32, 8, 1, 131072, 128), (1, 32, 8, 1, 32768, 64),
          (1, 32, 8, 1, 131072, 64)]  # (B, H, H_kv, N_q, N_kv, d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20, help="graph replays per time (median)")
    ap.add_argument("--dim", type=int, choices=sorted(TILES), help="only the shapes of this head dim")
    args = ap.parse_args()
    for shape in SHAPES:
        if args.dim and shape[5] != args.dim:
            continue
        times = [(name, ours_graph(shape, "f16", "cuda-tc", args.repeat, "cuda-tc=" + name)
                  ["median_ms"] * 1e3) for name in TILES[shape[5]]]
        cudnn = torch_ms(shape, "f16", "CUDNN_ATTENTION", args.repeat, True) * 1e3
        print(shape, " ".join(f"{name}={t:7.1f}" for name, t in times), f"cudnn={cudnn:7.1f}",
              flush=True)


if __name__ == "__main__":
    main()
