// cuda/ptx/dependent_launch.cuh — programmatic dependent launch (Hopper, sm_90): a kernel launched
// right after another on the same stream, with the launch attribute
// cudaLaunchAttributeProgrammaticStreamSerialization (cuda/host/dependent_launch.hpp), may start
// its CTAs before the first kernel has finished, so that its launch and its CTAs' start overlap
// the first kernel's last CTAs instead of following them. Two calls make that safe:
//   * the first kernel says when the second may start (allow_dependent_launch; a kernel that
//     never says it allows it when it ends);
//   * the second waits, before it reads anything the first writes, until the first grid has
//     finished and its writes are visible (wait_for_prerequisite_grid).
// On older GPUs, and for a kernel launched without the attribute, both are no-ops: the second
// kernel starts after the first as on any stream.
#pragma once

namespace flashattn::cuda {

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace flashattn::cuda
