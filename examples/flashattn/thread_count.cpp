// examples/flashattn/thread_count.cpp — see thread_count.hpp.
#include "thread_count.hpp"

#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace flashattn::cli {
namespace {

// Whether `count` threads can run at once in this process: count - 1 are started (the calling
// thread is a team's first) and kept waiting until all have started, then joined. libgomp's
// threads have the same default stack size as these, so where these start, its team starts too.
void check_threads_start(int count, const std::string& source) {
    std::mutex mutex;
    std::condition_variable go;
    bool started = false;
    std::vector<std::thread> threads;
    std::string failure;
    try {
        for (int i = 1; i < count; ++i)
            threads.emplace_back([&] {
                std::unique_lock<std::mutex> lock(mutex);
                go.wait(lock, [&] { return started; });
            });
    } catch (const std::system_error& e) {
        failure = e.what();
    }
    {
        std::lock_guard<std::mutex> lock(mutex);
        started = true;
    }
    go.notify_all();
    for (std::thread& t : threads) t.join();
    if (!failure.empty())
        throw std::invalid_argument(source + " = " + std::to_string(count) + ": only " +
                                    std::to_string(threads.size() + 1) + " of " +
                                    std::to_string(count) + " threads could be started here (" +
                                    failure + ")");
}

}  // namespace

int max_thread_count() { return 4 * std::max(1, omp_get_num_procs()); }

int checked_thread_count(std::optional<int> requested) {
    const std::string source = requested ? "--threads" : "OMP_NUM_THREADS";
    const int threads = requested.value_or(omp_get_max_threads());
    if (threads > max_thread_count())
        throw std::invalid_argument(source + " = " + std::to_string(threads) + ": at most " +
                                    std::to_string(max_thread_count()) +
                                    " (4x the processors here) are used");
    check_threads_start(threads, source);
    return threads;
}

}  // namespace flashattn::cli
