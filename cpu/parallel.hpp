// cpu/parallel.hpp — an OpenMP loop that carries exceptions out of the parallel region.
//
// An exception must not escape an OpenMP region (the runtime would call std::terminate). The CPU
// forms throw on bad input or on a failed allocation, so their parallel loops go through here:
// the first exception is kept and rethrown on the calling thread after the loop.
#pragma once

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

}  // namespace flashattn
