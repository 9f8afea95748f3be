// examples/flashattn/progress.hpp — progress lines on stderr for the long phases of `bench`.
//
// A phase (preparing a backend, the untimed forward a backward needs, a warm-up run, a timed
// round) can itself run for hours on a huge problem, with no place inside it to print from. So a
// reporter thread watches the current phase: once it has run longer than `after_seconds`, it says
// so, and then again every 10 s while it lasts (on a terminal, one line updated in place). The
// thread sleeps until the next line is due, so it takes no time from what is being timed.
// Lines go to stderr only: `bench --json`'s stdout stays one JSON object per line.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace flashattn::cli {

class Progress {
public:
    // after_seconds: how long a phase runs before it is reported (0: every phase, at its start).
    explicit Progress(double after_seconds);
    ~Progress();  // ends the current phase and the reporter thread
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    void phase(const std::string& what);  // a new phase begins (the last one has ended)
    void done();                          // no phase now: nothing to report, the line ended

private:
    using Clock = std::chrono::steady_clock;
    void report();  // the reporter thread
    void print(Clock::time_point now);  // with mutex_ held

    const std::chrono::duration<double> after_;
    const bool terminal_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::string phase_;  // empty: none
    Clock::time_point phase_start_, next_line_;
    bool stop_ = false, line_open_ = false;
    std::thread reporter_;
};

}  // namespace flashattn::cli
