// examples/flashattn/progress.cpp — see progress.hpp.
#include "progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace flashattn::cli {
namespace {

// How often a phase that goes on is reported again: in place on a terminal, else a new line (a
// log file gets one line per 10 s, not a flood).
constexpr std::chrono::milliseconds kTerminalEvery{500};
constexpr std::chrono::seconds kLogEvery{10};

}  // namespace

Progress::Progress(double after_seconds)
    : after_(after_seconds), terminal_(::isatty(2) != 0), reporter_([this] { report(); }) {}

Progress::~Progress() {
    done();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    changed_.notify_all();
    reporter_.join();
}

void Progress::done() {
    phase("");
    std::lock_guard<std::mutex> lock(mutex_);
    if (line_open_) std::fprintf(stderr, "\n");  // what follows starts on a line of its own
    line_open_ = false;
}

void Progress::phase(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_ = what;
    phase_start_ = Clock::now();
    next_line_ = phase_start_ + std::chrono::duration_cast<Clock::duration>(after_);
    if (!phase_.empty() && after_.count() <= 0) print(phase_start_);  // every phase, now
    changed_.notify_all();
}

void Progress::report() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
        if (phase_.empty()) {
            changed_.wait(lock);
            continue;
        }
        const Clock::time_point due = next_line_;
        if (changed_.wait_until(lock, due) == std::cv_status::timeout && !stop_ &&
            !phase_.empty() && next_line_ == due)
            print(Clock::now());
    }
}

void Progress::print(Clock::time_point now) {
    const double seconds = std::chrono::duration<double>(now - phase_start_).count();
    if (terminal_)
        std::fprintf(stderr, "\rbench: %s, %.0f s     ", phase_.c_str(), seconds);
    else
        std::fprintf(stderr, "bench: %s, %.0f s\n", phase_.c_str(), seconds);
    std::fflush(stderr);
    line_open_ = terminal_;
    next_line_ = now + (terminal_ ? Clock::duration(kTerminalEvery) : Clock::duration(kLogEvery));
}

}  // namespace flashattn::cli
