#!/usr/bin/env python3
"""cuda/tools/with_python_function.py — runs a Python script with flashattn's eager autograd on
CUDA tensors taken by the Python torch.autograd.Function (_AttentionFunction) instead of the C++
node (AttentionNode, examples/python/torch_ops.cpp): the "before" of the A/B in docs/python.md
("Autograd in C++"), on the same build.

    PYTHONPATH=build/gpu/python python3 cuda/tools/with_python_function.py \\
        examples/python/overhead.py --training --autocast bfloat16 --batch 1 --heads 12 \\
        --seq 1024 --dim 64 --causal --rounds 400

It replaces flashattn._eager_forward (which flashattn.attention looks up at each call) with the
same function less its branch to the C++ node, then runs the script as __main__ with the
remaining arguments. Everything else (the C++ fast paths of the forward and backward, the plans)
is the package's own.
"""
import runpy
import sys

import torch

import flashattn


def _eager_forward(q, k, v, causal, scale, backend, block_mask, block_size):
    """flashattn._eager_forward without the C++ node: the operator where a tracer needs it, the
    Python Function where autograd records the call, else the implementation."""
    if flashattn._needs_operator(q, k, v):
        return flashattn._FORWARD_OP(q, k, v, causal, scale, backend, block_mask, block_size)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return flashattn._AttentionFunction.apply(q, k, v, causal, scale, backend, block_mask,
                                                  block_size)
    return flashattn._forward_impl(q, k, v, causal, scale, backend, block_mask, block_size)


def main():
    if len(sys.argv) < 2:
        print("error: give the script to run (and its arguments)", file=sys.stderr)
        return 2
    flashattn._eager_forward = _eager_forward
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
