// cpu/parallel.hpp — OpenMP loops that carry exceptions out of the parallel region.
//
// An exception must not escape an OpenMP region (the runtime would call std::terminate). The CPU
// forms throw on bad input or on a failed allocation, so their parallel loops go through here:
// the first exception is kept and rethrown on the calling thread after the loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>

namespace flashattn {

template <class Body>
void parallel_for(std::int64_t count, Body&& body) {
    std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1) if (count > 1)
    for (std::int64_t i = 0; i < count; ++i) {
        try {
            body(i);
        } catch (...) {
#pragma omp critical(flashattn_parallel_error)
            if (!error) error = std::current_exception();
        }
    }
    if (error) std::rethrow_exception(error);
}

// parallel_for for loops whose iterations need per-thread scratch (tile buffers): every thread
// of the team calls make_state() once, then takes iterations i = 0 .. count-1 one at a time, in a
// dynamic order, and runs body(state, i). Two differences from parallel_for that the omp form
// relies on:
//   * the team is always started, even for count == 1, so a library called inside (Eigen's GEMM,
//     which the omp form once used) always sees omp_get_num_threads() == the team size and never
//     starts nested threads of its own;
//   * make_state() may throw too (an allocation), and is caught like body.
// Iterations are handed out with an atomic counter rather than `omp for`, so that a thread whose
// make_state() threw can simply stop without leaving the others waiting at a barrier.
template <class MakeState, class Body>
void parallel_for_with_state(std::int64_t count, MakeState&& make_state, Body&& body) {
    std::exception_ptr error;
    std::atomic<std::int64_t> next{0};
#pragma omp parallel
    {
        try {
            auto state = make_state();
            for (std::int64_t i = next++; i < count; i = next++) body(state, i);
        } catch (...) {
#pragma omp critical(flashattn_parallel_error)
            if (!error) error = std::current_exception();
            next = count;  // the other threads stop after their current iteration
        }
    }
    if (error) std::rethrow_exception(error);
}

}  // namespace flashattn
