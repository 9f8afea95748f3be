// common/config.hpp — one macro that lets the shared core compile for host and device.
//
// Everything in common/ is header-only and free of Eigen, OpenMP and CUDA runtime calls, so the
// scalar CPU form, the OpenMP form and every CUDA kernel include the very same arithmetic.
#pragma once

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__
#else
#define FA_HOST_DEVICE
#endif
