// tests/test_memory_limits.cpp — running out of memory says how many bytes were needed and for
// what, on every CPU backend, also under an address-space limit (`ulimit -v`, RLIMIT_AS) far below
// the machine's memory, where an allocation used to fail as a bare std::bad_alloc.
//
// Each case runs in a forked child that lowers its own RLIMIT_AS to what it has mapped plus a
// little (so the test does not depend on how much this machine or this process maps), runs one
// call and sends back the message of what it threw. The parent checks the message. CTest runs
// each TEST_CASE in a process of its own, so no OpenMP team exists when the child is forked; the
// calls refused here are refused before any parallel region, and an alarm ends a child that is
// not.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "backends_under_test.hpp"
#include "cpu/workspace.hpp"

using namespace flashattn;

namespace {

// Runs `call` in a child process whose address-space limit leaves `headroom` bytes beyond what it
// has mapped once `setup` has run; returns what it threw ("no error" when it did not).
std::string message_under_limit(double headroom, const std::function<void()>& setup,
                                const std::function<void()>& call) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(fds[0]);
        ::alarm(120);  // a call that is not refused must not hang the suite
        std::string message = "no error";
        try {
            setup();
            const double limit = mapped_bytes() + headroom;
            const rlimit lowered{static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
            if (::setrlimit(RLIMIT_AS, &lowered) != 0) message = "setrlimit failed";
            else call();
        } catch (const std::exception& e) {
            message = e.what();
        }
        const char* data = message.c_str();
        for (std::size_t left = message.size(); left > 0;) {
            const ssize_t n = ::write(fds[1], data, left);
            if (n <= 0) break;
            data += n, left -= static_cast<std::size_t>(n);
        }
        ::_exit(0);
    }
    ::close(fds[1]);
    std::string message;
    char buffer[512];
    for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;)
        message.append(buffer, static_cast<std::size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    INFO(message);
    REQUIRE(WIFEXITED(status));
    return message;
}

constexpr double kMiB = 1 << 20;

// Q, K, V of 16 MiB each: B = 1, H = 4, N = 16384, d = 64.
AttentionProblem large_problem() {
    AttentionProblem p;
    p.batch = 1, p.heads = 4, p.heads_kv = 4, p.seq_q = 16384, p.seq_kv = 16384, p.dim = 64;
    return p;
}

}  // namespace

TEST_CASE("every CPU backend's prepare beyond the address-space limit names the bytes and what "
          "they are for") {
    const AttentionProblem p = large_problem();
    for (const Backend& b : available_backends()) {
        if (b.device != "cpu") continue;
        for (DType dtype : {DType::f32, DType::bf16}) {
            INFO(b.name << " " << to_string(dtype));
            std::vector<float> x, O, lse;
            const auto setup = [&] {
                x.assign(static_cast<std::size_t>(p.q_elements()), 0.5f);
                O.assign(x.size(), 0.0f);
                lse.assign(static_cast<std::size_t>(p.lse_elements()), 0.0f);
            };
            const std::string forward = message_under_limit(4 * kMiB, setup, [&] {
                b.prepare(p, x.data(), x.data(), x.data(), dtype);
            });
            CHECK_THAT(forward, Catch::Contains("backend " + b.name + ": its O and LSE"));
            CHECK_THAT(forward, Catch::Contains(" bytes ("));
            CHECK_THAT(forward, Catch::Contains("needed"));
            CHECK_THAT(forward, Catch::Contains("ulimit -v"));
            if (dtype != DType::f32) CHECK_THAT(forward, Catch::Contains("rounded to bf16"));
            if (!b.has_backward()) continue;
            const std::string backward = message_under_limit(4 * kMiB, setup, [&] {
                const BackwardInputs in{x.data(), x.data(), x.data(), O.data(), lse.data(),
                                        x.data()};
                b.prepare_backward(p, in, dtype);
            });
            CHECK_THAT(backward, Catch::Contains("backend " + b.name + ": its dQ, dK, dV"));
            CHECK_THAT(backward, Catch::Contains(" bytes ("));
            CHECK_THAT(backward, Catch::Contains("ulimit -v"));
        }
    }
}

TEST_CASE("standard attention's S beyond the address-space limit names its bytes") {
    // S is 8192 x 8192 floats (256 MiB) per head; the inputs are 32 KiB.
    AttentionProblem p;
    p.seq_q = p.seq_kv = 8192, p.dim = 1;
    const Backend& b = find_backend("standard");
    std::vector<float> x, O, lse;
    const std::string message = message_under_limit(
        64 * kMiB,
        [&] {
            x.assign(static_cast<std::size_t>(p.q_elements()), 0.5f);
            O.assign(x.size(), 0.0f), lse.assign(x.size(), 0.0f);
        },
        [&] { run_backend(b, p, x.data(), x.data(), x.data(), O.data(), lse.data()); });
    CHECK_THAT(message, Catch::Contains("standard attention's S = QK^T (8192 x 8192 per head)"));
    CHECK_THAT(message, Catch::Contains("268435456 bytes (256.0 MiB) needed"));
    CHECK_THAT(message, Catch::Contains("ulimit -v"));
}

TEST_CASE("omp's tile buffers beyond the address-space limit name their bytes") {
    // Tiles asked for as large as the sequence (2^20 keys): tens of MiB per thread.
    AttentionProblem p;
    p.seq_q = p.seq_kv = 1 << 20, p.dim = 1;
    p.block_q = p.block_kv = 1 << 20;
    const Backend& b = find_backend("omp");
    std::vector<float> x, O, lse;
    const std::string message = message_under_limit(
        16 * kMiB,
        [&] {
            x.assign(static_cast<std::size_t>(p.q_elements()), 0.5f);
            O.assign(x.size(), 0.0f), lse.assign(x.size(), 0.0f);
        },
        [&] { run_backend(b, p, x.data(), x.data(), x.data(), O.data(), lse.data()); });
    CHECK_THAT(message, Catch::Contains("omp's tile buffers"));
    CHECK_THAT(message, Catch::Contains(" bytes ("));
    CHECK_THAT(message, Catch::Contains("ulimit -v"));
}

TEST_CASE("a failed allocation and a refused estimate name the bytes, what and the limit") {
    const std::string allocation = message_under_limit(1 * kMiB, [] {}, [] {
        WorkBuffer<float> buffer(std::size_t{16} << 20, "a test buffer");  // 64 MiB
    });
    CHECK_THAT(allocation,
               Catch::Contains("a test buffer: out of memory allocating 67108864 bytes (64.0 MiB)"));
    CHECK_THAT(allocation, Catch::Contains("ulimit -v"));
    const std::string estimate =
        message_under_limit(1 * kMiB, [] {}, [] { require_memory(64 * kMiB, "a test buffer"); });
    CHECK_THAT(estimate, Catch::Contains("a test buffer: 67108864 bytes (64.0 MiB) needed, more "
                                         "than the "));
    CHECK_THAT(estimate, Catch::Contains("address-space limit (ulimit -v: "));
    // Without a limit, a size the machine holds passes and one beyond it names the machine.
    CHECK_NOTHROW(require_memory(64 * kMiB, "a test buffer"));
    CHECK_THROWS_WITH(require_memory(1e30, "a test buffer"),
                      Catch::Contains("a test buffer: 1e+30 bytes") &&
                          Catch::Contains("more than this machine's"));
}

TEST_CASE("bytes_text gives the exact count and a readable size") {
    CHECK(bytes_text(512) == "512 bytes");
    CHECK(bytes_text(1536) == "1536 bytes (1.5 KiB)");
    CHECK(bytes_text(double(std::int64_t{3} << 30)) == "3221225472 bytes (3.0 GiB)");
}
