#!/usr/bin/env bash
# cuda/tools/wgmma_probe.sh — builds cuda/tools/wgmma_probe.cu for sm_90a and runs every candidate
# descriptor setting in its own process (a wrong one may read outside shared memory and fault),
# printing the ones whose product is right.
set -u
cd "$(dirname "$0")/../.."
nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a cuda/tools/wgmma_probe.cu -o /tmp/wgmma_probe || exit 1
for mode in 0 1; do for step in 32 2048; do for lbo in 0 16 128 1024 2048 4096 8192; do
    for sbo in 0 16 128 1024 2048 4096 8192; do
        /tmp/wgmma_probe $mode $step $lbo $sbo 2>/dev/null | grep "max error" | awk '$NF+0 < 1e-2'
    done
done; done; done
