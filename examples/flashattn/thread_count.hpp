// examples/flashattn/thread_count.hpp — the thread count of the CPU backends in `bench`, bounded
// and checked before OpenMP sees it.
//
// libgomp cannot report a thread it failed to create except by ending the process (status 1, its
// own message), outside the command line's contract ("error:", exit 2). So a count is refused
// here first when it is beyond the bound, or when that many threads cannot start in this process
// (ulimit -u, ulimit -v).
#pragma once

#include <optional>

namespace flashattn::cli {

// 4x the processors OpenMP sees. Past the processors, more threads only take turns on the same
// cores, so a benchmark learns nothing more from them; 4x still lets one see that happen.
int max_thread_count();

// `requested` (--threads), or OpenMP's default (OMP_NUM_THREADS, else one per processor), checked:
// at most max_thread_count(), and startable here. Throws std::invalid_argument naming where the
// count came from ("--threads = 100000: at most 64 ...").
int checked_thread_count(std::optional<int> requested);

}  // namespace flashattn::cli
