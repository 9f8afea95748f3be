// cuda/host/dependent_launch.hpp — the host side of programmatic dependent launch
// (cuda/ptx/dependent_launch.cuh): a kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may start its CTAs before the stream's
// previous kernel has finished, once that kernel allows it (allow_dependent_launch) or ends.
//
// Only a kernel that calls wait_for_prerequisite_grid() before it reads or writes anything another
// kernel may touch is launched this way: the wait returns once the previous kernel has finished
// and its writes are visible, so the stream's order holds for memory and only the launch's
// latency and the CTAs' start overlap the previous kernel. On GPUs before Hopper, and for a kernel
// compiled for them only (has_grid_dependency_control), the attribute is left off and the launch
// is an ordinary one. FLASHATTN_DEPENDENT_LAUNCH=0 in the environment leaves it off everywhere
// (to rule the overlap out when debugging, and to time a build with and without it).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "cuda/host/check.hpp"
#include "cuda/host/prepared.hpp"

namespace flashattn::cuda {

// Whether dependent launches are allowed: not when FLASHATTN_DEPENDENT_LAUNCH=0 (read once).
inline bool dependent_launch_enabled() {
    static const bool enabled = [] {
        const char* value = std::getenv("FLASHATTN_DEPENDENT_LAUNCH");
        return value == nullptr || std::strcmp(value, "0") != 0;
    }();
    return enabled;
}

template <class... Params, class... Args>
void launch_overlapping_previous(void (*kernel)(Params...), dim3 grid, dim3 block,
                                 std::size_t smem_bytes, cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    cudaLaunchAttribute overlap = {};
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    if (dependent_launch_enabled() && device_limits().compute_major >= 9 &&
        has_grid_dependency_control(reinterpret_cast<const void*>(kernel)))
        config.attrs = &overlap, config.numAttrs = 1;
    FA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...));
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
