// tests/test_cuda_device_entries.cpp — the device entries (Backend::run_device and
// run_backward_device, common/backend.hpp) keep their asynchronous contract: work queued on the
// caller's stream behind what is already there, no wait, the caller's workspace (of exactly
// device_workspace_bytes) and device block mask, and an overflowed row marked NaN where a fully
// masked row gives O = 0, LSE = -inf. Results are compared with the same backend's host path (the
// same kernels, checked against float64 attention by the other suites). Exits 77 (CTest's
// "skipped") without a CUDA device.
//
// How "no wait" is tested: a host function queued first holds the stream until the test releases
// it after the entry has returned. An entry that synchronized would find it held; the host
// function gives up after kHoldSeconds and the test then fails (instead of hanging).
#include "catch.hpp"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/gqa_packing.hpp"
#include "common/registry.hpp"
#include "common/tiling.hpp"
#include "cpu/reference.hpp"
#include "cuda/fa2/backend.hpp"
#include "cuda/fa3/backend.hpp"
#include "cuda/fa3/tensor_map.hpp"
#include "cuda/host/device_buffer.hpp"
#include "cuda/host/half_bits.hpp"
#include "cuda/tc/backend.hpp"
#include "helpers.hpp"

using namespace flashattn;

namespace {

constexpr double kHoldSeconds = 20.0;

// A stream of its own that does not synchronize with the legacy default stream, so a launch on
// the default stream by mistake is not ordered behind it.
struct Stream {
    cudaStream_t s = nullptr;
    Stream() { FA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    ~Stream() { (void)cudaStreamDestroy(s); }
};

// Holds a stream until release(): what is queued behind it cannot start before.
struct Hold {
    std::atomic<bool> released{false}, gave_up{false};
    static void CUDART_CB wait(void* self) {
        auto* h = static_cast<Hold*>(self);
        const auto start = std::chrono::steady_clock::now();
        while (!h->released.load()) {
            if (std::chrono::steady_clock::now() - start > std::chrono::duration<double>(kHoldSeconds)) {
                h->gave_up = true;
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    void queue(cudaStream_t s) { FA_CUDA_CHECK(cudaLaunchHostFunc(s, &Hold::wait, this)); }
    // Called once the entry has returned: whether it waited (the stream no longer held, or the
    // hold gave up), after releasing the stream and waiting for what was queued behind it.
    bool release_after_entry(cudaStream_t s) {
        const bool still_held = cudaStreamQuery(s) == cudaErrorNotReady;
        released = true;
        FA_CUDA_CHECK(cudaStreamSynchronize(s));
        return gave_up.load() || !still_held;
    }
};

// Page-locked host memory: cudaMemcpyAsync from it is queued, not performed on the spot.
struct Pinned {
    void* p = nullptr;
    explicit Pinned(std::size_t bytes) { FA_CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1)); }
    ~Pinned() { (void)cudaFreeHost(p); }
};

// An input array as the device entries read it: float32, or 16-bit values of dtype (times `sign`).
std::vector<std::uint8_t> as_bytes(const std::vector<float>& x, DType dtype, float sign = 1.0f) {
    if (dtype == DType::f32) {
        std::vector<std::uint8_t> out(x.size() * 4);
        std::memcpy(out.data(), x.data(), out.size());
        return out;
    }
    std::vector<std::uint8_t> out(x.size() * 2);
    for (std::size_t k = 0; k < x.size(); ++k) {
        const std::uint16_t bits = cuda::to_bits(sign * x[k], dtype);
        std::memcpy(out.data() + 2 * k, &bits, 2);
    }
    return out;
}

// A device copy of `host` bytes, written on `stream` from pinned memory after the array was
// filled with 0xFF (so a read before the copy sees NaN or garbage, not the right values).
struct Staged {
    cuda::DeviceBuffer<std::uint8_t> device;
    Pinned pinned;
    explicit Staged(const std::vector<std::uint8_t>& host)
        : device(host.size()), pinned(host.size()) {
        std::memcpy(pinned.p, host.data(), host.size());
    }
    void poison(cudaStream_t s) {
        if (device.bytes()) FA_CUDA_CHECK(cudaMemsetAsync(device.data(), 0xFF, device.bytes(), s));
    }
    void copy(cudaStream_t s) {
        if (device.bytes())
            FA_CUDA_CHECK(cudaMemcpyAsync(device.data(), pinned.p, device.bytes(),
                                          cudaMemcpyHostToDevice, s));
    }
    const void* data() const { return device.data(); }
};

// The caller's workspace: device_workspace_bytes (at least one byte, so the address is real),
// filled with 0xFF on the stream before the call.
struct Workspace {
    std::size_t bytes;
    cuda::DeviceBuffer<std::uint8_t> buffer;
    Workspace(std::size_t need, cudaStream_t s) : bytes(need), buffer(need ? need : 1) {
        FA_CUDA_CHECK(cudaMemsetAsync(buffer.data(), 0xFF, buffer.bytes(), s));
    }
};

std::vector<float> download(const cuda::DeviceBuffer<float>& x) {
    std::vector<float> host(x.size());
    x.download(host.data());
    return host;
}

// Equal element by element, NaN where the other has NaN; the largest difference otherwise.
double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (std::size_t k = 0; k < a.size(); ++k) {
        if (std::isnan(a[k]) || std::isnan(b[k])) {
            if (std::isnan(a[k]) != std::isnan(b[k])) return std::numeric_limits<double>::infinity();
            continue;
        }
        if (a[k] == b[k]) continue;  // the same infinity too
        worst = std::max(worst, std::fabs(double(a[k]) - double(b[k])));
    }
    return worst;
}

double max_abs(const std::vector<float>& x) {
    double m = 0;
    for (float v : x)
        if (std::isfinite(v)) m = std::max(m, double(std::fabs(v)));
    return m;
}

struct Case {
    std::string backend;
    DType dtype;
    std::int64_t dim;
};

// The device entries of this build and device: cuda-fa2 (float32; d = 64 runs the tensor-core
// kernel behind the on-device finiteness test, d = 8 the FFMA kernel alone), cuda-tc, cuda-fa3.
std::vector<Case> forward_cases() {
    std::vector<Case> cases = {{"cuda-fa2", DType::f32, 64},
                               {"cuda-fa2", DType::f32, 8},
                               {"cuda-tc", DType::f16, 64},
                               {"cuda-tc", DType::bf16, 64}};
    if (fa3::fa3_available()) {
        cases.push_back({"cuda-fa3", DType::f16, 64});
        cases.push_back({"cuda-fa3", DType::bf16, 128});
    }
    return cases;
}

// A (Tr, Tc) block mask of 8 x 8 blocks with a few zero entries, and one whole row of blocks
// zero (its query rows see no key).
std::vector<std::uint8_t> sparse_mask(const AttentionProblem& p) {
    const std::int64_t Tr = tile_count(p.seq_q, 8), Tc = tile_count(p.seq_kv, 8);
    std::vector<std::uint8_t> mask(static_cast<std::size_t>(Tr * Tc));
    for (std::int64_t r = 0; r < Tr; ++r)
        for (std::int64_t c = 0; c < Tc; ++c) mask[r * Tc + c] = (r != 2) && ((r + c) % 3 != 1);
    return mask;
}

// The forward through the device entry with everything queued behind a held stream: inputs
// poisoned, then (held) copied, workspace poisoned, the call, then the release.
struct DeviceOutputs {
    std::vector<float> O, lse;
    bool entry_waited;
};
DeviceOutputs run_forward_on_stream(const Backend& backend, const AttentionProblem& p,
                                    const ProblemData& in, DType dtype,
                                    const std::vector<std::uint8_t>& mask) {
    Stream stream;
    const cudaStream_t s = stream.s;
    Staged Q(as_bytes(in.Q, dtype, dtype == DType::f32 ? 1.0f : cuda::q_sign(p)));
    Staged K(as_bytes(in.K, dtype)), V(as_bytes(in.V, dtype));
    Staged mask_device(mask);
    cuda::DeviceBuffer<float> O(p.q_elements()), lse(p.lse_elements());
    Workspace workspace(backend.device_workspace_bytes ? backend.device_workspace_bytes(p, dtype) : 0,
                        s);
    for (Staged* x : {&Q, &K, &V, &mask_device}) x->poison(s);
    FA_CUDA_CHECK(cudaMemsetAsync(O.data(), 0xFF, O.bytes(), s));
    FA_CUDA_CHECK(cudaMemsetAsync(lse.data(), 0xFF, lse.bytes(), s));
    Hold hold;
    hold.queue(s);
    for (Staged* x : {&Q, &K, &V, &mask_device}) x->copy(s);

    DeviceForward a;
    a.Q = Q.data(), a.K = K.data(), a.V = V.data(), a.O = O.data(), a.lse = lse.data();
    a.stream = s, a.dtype = dtype;
    a.workspace = workspace.buffer.data(), a.workspace_bytes = workspace.bytes;
    a.block_mask = p.block_mask.active() ? mask_device.device.data() : nullptr;
    backend.run_device(p, a);
    const bool waited = hold.release_after_entry(s);
    return {download(O), download(lse), waited};
}

}  // namespace

TEST_CASE("device entries queue behind the caller's stream, return at once, and match the host path") {
    for (const Case& c : forward_cases()) {
        const Backend& backend = find_backend(c.backend);
        REQUIRE(backend.run_device);
        for (bool causal : {false, true})
            for (bool masked : {false, true})
                for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
                         {113, 203}, {203, 113}}) {
                    AttentionProblem p = test::make_problem(2, 4, 2, Nq, Nkv, c.dim, causal);
                    const std::vector<std::uint8_t> mask = masked ? sparse_mask(p) : std::vector<std::uint8_t>{};
                    if (masked) p.block_mask = {mask.data(), 8, 8};
                    const std::uint64_t seed = test::next_seed();
                    INFO(c.backend << " " << to_string(c.dtype) << " " << test::describe(p)
                                   << " mask=" << masked << " seed=" << seed);
                    const ProblemData in = random_problem_data(p, seed);
                    const test::Outputs host = test::run_poisoned(backend, p, in, c.dtype);
                    const DeviceOutputs device = run_forward_on_stream(backend, p, in, c.dtype, mask);
                    CHECK_FALSE(device.entry_waited);
                    // The same kernels on the same values: the same bits.
                    CHECK(max_difference(device.O, host.O) == 0.0);
                    CHECK(max_difference(device.lse, host.lse) == 0.0);
                }
    }
}

TEST_CASE("cuda-fa3's device entry: a work-tile counter only with more work tiles than SMs") {
    if (!fa3::fa3_available()) return;
    const Backend& fa3 = find_backend("cuda-fa3");
    // 2 x 4 heads of one or two query tiles: a CTA each, no counter, no workspace. 2 x 40 heads
    // of 1100 query rows: hundreds of work tiles, more than any GPU's SMs, taken from the counter
    // in the workspace (poisoned before the call: the entry zeroes it on the stream).
    const AttentionProblem small = test::make_problem(2, 4, 2, 113, 203, 64, true);
    CHECK(fa3.device_workspace_bytes(small, DType::f16) == 0);
    for (bool causal : {false, true}) {
        const AttentionProblem p = test::make_problem(2, 40, 8, 1100, 301, 64, causal);
        const std::size_t need = fa3.device_workspace_bytes(p, DType::f16);
        REQUIRE(need > 0);
        {  // a workspace too small, or none, is refused before anything is queued
            cuda::DeviceBuffer<std::uint16_t> X(p.q_elements());
            cuda::DeviceBuffer<float> O(p.q_elements()), lse(p.lse_elements());
            cuda::DeviceBuffer<std::uint8_t> workspace(need);
            DeviceForward a;
            a.Q = X.data(), a.K = X.data(), a.V = X.data(), a.O = O.data(), a.lse = lse.data();
            a.dtype = DType::f16, a.workspace = workspace.data(), a.workspace_bytes = need - 1;
            CHECK_THROWS_WITH(fa3.run_device(p, a),
                              Catch::Contains("at least " + std::to_string(need) + " bytes"));
            a.workspace = nullptr, a.workspace_bytes = 0;
            CHECK_THROWS_AS(fa3.run_device(p, a), std::invalid_argument);
        }
        const std::uint64_t seed = test::next_seed();
        INFO(test::describe(p) << " seed=" << seed);
        const ProblemData in = random_problem_data(p, seed);
        const test::Outputs host = test::run_poisoned(fa3, p, in, DType::f16);
        const DeviceOutputs device = run_forward_on_stream(fa3, p, in, DType::f16, {});
        CHECK(max_difference(device.O, host.O) == 0.0);
        CHECK(max_difference(device.lse, host.lse) == 0.0);
    }
}

namespace {

// Calls f(b, h, r, c, i) for every element of a (batch, heads, rows, d) array, i its index in the
// contiguous order: how the strided arrays below are filled from and checked against contiguous
// ones.
template <class F>
void for_each_element(std::int64_t batch, std::int64_t heads, std::int64_t rows, std::int64_t d,
                      F&& f) {
    for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t h = 0; h < heads; ++h)
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t c = 0; c < d; ++c)
                    f(b, h, r, c, static_cast<std::size_t>(((b * heads + h) * rows + r) * d + c));
}

// A (batch, heads, rows, d) array of 16-bit values laid out as (batch, rows, heads, d) -- the order
// of q, k and v cut from one projection -- with 8 unused elements after each row of heads and 16
// after each batch entry, so that every stride differs from the contiguous one. Unused elements
// hold 0xFFFF (NaN in f16 and bf16).
struct Strided16 {
    ArrayLayout layout;
    std::int64_t lead;  // elements before (0, 0, 0, 0): the array's address is the buffer's + lead
    std::vector<std::uint16_t> host;

    // Rows of heads x d values and row_pad more (8 by default: strides TMA can reach).
    Strided16(std::int64_t batch, std::int64_t heads, std::int64_t rows, std::int64_t d,
              std::int64_t row_pad = 8, std::int64_t lead_ = 0)
        : lead(lead_) {
        const std::int64_t row = heads * d + row_pad;
        layout = {rows * row + 16, d, row};
        host.assign(static_cast<std::size_t>(lead + batch * layout.batch), 0xFFFF);
    }
    std::size_t at(std::int64_t b, std::int64_t h, std::int64_t r, std::int64_t c) const {
        return static_cast<std::size_t>(lead + layout.offset(b, h) + r * layout.row + c);
    }
};

// The contiguous (batch, heads, rows, d) array x of problem shape (heads, rows) in a Strided16.
Strided16 strided_copy(const std::vector<float>& x, std::int64_t batch, std::int64_t heads,
                       std::int64_t rows, std::int64_t d, DType dtype, float sign = 1.0f) {
    Strided16 out(batch, heads, rows, d);
    for_each_element(batch, heads, rows, d, [&](auto b, auto h, auto r, auto c, std::size_t i) {
        out.host[out.at(b, h, r, c)] = cuda::to_bits(sign * x[i], dtype);
    });
    return out;
}

std::vector<std::uint8_t> bytes_of(const std::vector<std::uint16_t>& x) {
    std::vector<std::uint8_t> out(x.size() * 2);
    std::memcpy(out.data(), x.data(), out.size());
    return out;
}

// An output written into a Strided16 (`bits`, downloaded) against the contiguous float32 `expect`:
// how many of its values differ from `expect` rounded to nearest even, and how many elements
// outside its rows were touched (they must stay 0xFFFF).
struct StridedCheck {
    std::size_t wrong = 0, touched = 0;
};
StridedCheck compare_strided(const std::vector<std::uint16_t>& bits, const Strided16& at,
                             const std::vector<float>& expect, std::int64_t batch,
                             std::int64_t heads, std::int64_t rows, std::int64_t d, DType dtype) {
    StridedCheck out;
    std::vector<bool> inside(bits.size(), false);
    for_each_element(batch, heads, rows, d, [&](auto b, auto h, auto r, auto c, std::size_t i) {
        const std::size_t k = at.at(b, h, r, c);
        inside[k] = true;
        out.wrong += bits[k] != cuda::to_bits(expect[i], dtype);
    });
    for (std::size_t k = 0; k < bits.size(); ++k) out.touched += !inside[k] && bits[k] != 0xFFFF;
    return out;
}

std::vector<std::uint16_t> download_bits(const Staged& x) {
    std::vector<std::uint16_t> bits(x.device.bytes() / 2);
    x.device.download(reinterpret_cast<std::uint8_t*>(bits.data()));
    return bits;
}

// One forward device call on stream `s`: its LSE (poisoned) and its workspace (the backend's
// device_workspace_bytes, poisoned), and its DeviceForward with Q, K, V and O at the given device
// addresses -- contiguous arrays and a float32 O until the caller says otherwise.
struct ForwardCall {
    cuda::DeviceBuffer<float> lse;
    Workspace workspace;
    DeviceForward a;
    ForwardCall(const Backend& backend, const AttentionProblem& p, DType dtype, const void* Q,
                const void* K, const void* V, void* O, cudaStream_t s)
        : lse(p.lse_elements()), workspace(backend.device_workspace_bytes(p, dtype), s) {
        FA_CUDA_CHECK(cudaMemsetAsync(lse.data(), 0xFF, lse.bytes(), s));
        a.Q = Q, a.K = K, a.V = V, a.O = O, a.lse = lse.data();
        a.stream = s, a.dtype = dtype;
        a.workspace = workspace.buffer.data(), a.workspace_bytes = workspace.bytes;
    }
};

// One forward device call on strided 16-bit copies of a problem's inputs (Strided16: Q times
// q_sign, K, V), O written in the inputs' dtype at its own strides into an array of 0xFFFF. `call.a`
// holds the arguments, for the caller to vary.
struct StridedForward {
    Strided16 Qh, Kh, Vh, Oh;
    Stream stream;
    Staged Q, K, V, O;
    ForwardCall call;
    StridedForward(const Backend& backend, const AttentionProblem& p, DType dtype,
                   const ProblemData& in)
        : Qh(strided_copy(in.Q, p.batch, p.heads, p.seq_q, p.dim, dtype, cuda::q_sign(p))),
          Kh(strided_copy(in.K, p.batch, p.heads_kv, p.seq_kv, p.dim, dtype)),
          Vh(strided_copy(in.V, p.batch, p.heads_kv, p.seq_kv, p.dim, dtype)),
          Oh(p.batch, p.heads, p.seq_q, p.dim),
          Q(bytes_of(Qh.host)), K(bytes_of(Kh.host)), V(bytes_of(Vh.host)), O(bytes_of(Oh.host)),
          call(backend, p, dtype, Q.data(), K.data(), V.data(), O.device.data(), stream.s) {
        for (Staged* x : {&Q, &K, &V, &O}) x->copy(stream.s);
        DeviceForward& a = call.a;
        a.q_layout = Qh.layout, a.k_layout = Kh.layout, a.v_layout = Vh.layout;
        a.o_layout = Oh.layout, a.o_dtype = dtype;
    }
    // Runs the call and checks it against the host path's outputs `expect` (contiguous float32):
    // O is expect's O rounded to nearest even, bit for bit, nothing outside O's rows is written,
    // and the LSE has expect's bits.
    void run_and_check(const Backend& backend, const AttentionProblem& p, DType dtype,
                       const test::Outputs& expect) {
        backend.run_device(p, call.a);
        FA_CUDA_CHECK(cudaStreamSynchronize(stream.s));
        const StridedCheck o = compare_strided(download_bits(O), Oh, expect.O, p.batch, p.heads,
                                               p.seq_q, p.dim, dtype);
        CHECK(o.wrong == 0);
        CHECK(o.touched == 0);
        CHECK(max_difference(download(call.lse), expect.lse) == 0.0);
    }
};

}  // namespace

// The problems the strided tests run, each with fresh random inputs: ragged N_q = 113 and
// N_kv = 203, GQA 4 / 2, f16 at d = 64 and bf16 at d = 128, causal and not.
// body(problem, dtype, inputs, seed).
template <class Body>
void for_each_strided_case(Body&& body) {
    for (auto [dtype, dim] : std::vector<std::pair<DType, std::int64_t>>{{DType::f16, 64},
                                                                          {DType::bf16, 128}})
        for (bool causal : {false, true}) {
            const AttentionProblem p = test::make_problem(2, 4, 2, 113, 203, dim, causal);
            const std::uint64_t seed = test::next_seed();
            INFO(to_string(dtype) << " " << test::describe(p) << " seed=" << seed);
            body(p, dtype, random_problem_data(p, seed), seed);
        }
}

TEST_CASE("cuda-fa3's device entry reads strided Q, K, V and writes O in 16 bits where it lies") {
    const Backend* found = test::cuda_fa3_or_warn();
    if (!found) return;
    const Backend& fa3 = *found;
    REQUIRE(fa3.device_layouts);
    for_each_strided_case([&](const AttentionProblem& p, DType dtype, const ProblemData& in,
                              std::uint64_t) {
            // The host path: contiguous arrays, float32 O (checked against float64 elsewhere).
            const test::Outputs host = test::run_poisoned(fa3, p, in, dtype);
            // The same kernel on the same values, read and written at other strides.
            StridedForward strided(fa3, p, dtype, in);
            strided.run_and_check(fa3, p, dtype, host);

            // Strides TMA cannot read, an O dtype that is neither float32 nor the inputs', and a
            // misaligned 16-bit O are refused before any work.
            const DeviceForward& a = strided.call.a;
            DeviceForward bad = a;
            bad.k_layout.row = a.k_layout.row + 4;
            CHECK_THROWS_AS(fa3.run_device(p, bad), std::invalid_argument);
            bad = a;
            bad.o_dtype = dtype == DType::f16 ? DType::bf16 : DType::f16;
            CHECK_THROWS_AS(fa3.run_device(p, bad), std::invalid_argument);
            bad = a;
            bad.o_layout.row = a.o_layout.row + 1;
            CHECK_THROWS_AS(fa3.run_device(p, bad), std::invalid_argument);
        });
}

// Decoding shapes: one or four query rows of 8 heads (GQA over 2 KV heads) against 4099 keys
// leave most SMs idle, so cuda-fa3 splits the keys (split-KV, docs/decoding.md) and merges the
// chunks' partial results with the combine kernel. The host path's arrays are contiguous, so each
// GQA group is packed into one head's rows; through the device entry:
//   * contiguous arrays, S left to the backend: the same plan, the same bits;
//   * Q and O strided as (batch, rows, heads, d) with padding: a group's heads are not one block
//     of rows, so nothing is packed, and the combine writes the 16-bit O at its strides. At a
//     forced S (7) the chunks are the same, and each row's sums do not depend on the other rows
//     of its work tile: the same bits again, and nothing outside O's rows touched.
TEST_CASE("cuda-fa3's device entry splits the keys at decoding shapes, at the caller's layouts") {
    const Backend* found = test::cuda_fa3_or_warn();
    if (!found) return;
    const Backend& fa3 = *found;
    for (auto [dtype, dim] : std::vector<std::pair<DType, std::int64_t>>{{DType::f16, 64},
                                                                          {DType::bf16, 128}})
        for (std::int64_t Nq : {1, 4})
            for (bool causal : {false, true}) {
                AttentionProblem p = test::make_problem(1, 8, 2, Nq, 4099, dim, causal);
                const std::uint64_t seed = test::next_seed();
                INFO(to_string(dtype) << " " << test::describe(p) << " seed=" << seed);
                const ProblemData in = random_problem_data(p, seed);
                {
                    auto prepared = fa3.prepare(p, in.Q.data(), in.K.data(), in.V.data(), dtype);
                    prepared->execute();
                    CHECK(prepared->kv_splits() > 1);
                }
                const test::Outputs host = test::run_poisoned(fa3, p, in, dtype);
                const DeviceOutputs device = run_forward_on_stream(fa3, p, in, dtype, {});
                CHECK(max_difference(device.O, host.O) == 0.0);
                CHECK(max_difference(device.lse, host.lse) == 0.0);

                p.kv_splits = 7;
                const test::Outputs forced = test::run_poisoned(fa3, p, in, dtype);
                StridedForward strided(fa3, p, dtype, in);
                strided.run_and_check(fa3, p, dtype, forced);
            }
}

// GQA groups packed into one head's rows (common/gqa_packing.hpp) without a split: one decoding
// row per head (S forced to 1), and 65 query rows of 8 heads per KV head, which pack into 5
// query tiles instead of 8. Contiguous arrays and a 16-bit O: the packed problem's O goes out by
// TMA through a tensor map of the packed heads, and must hold the host path's bits (which pack
// too, and store a float32 O from registers), rounded to nearest even.
TEST_CASE("cuda-fa3's device entry stores a 16-bit O through the packed heads' tensor map") {
    const Backend* found = test::cuda_fa3_or_warn();
    if (!found) return;
    const Backend& fa3 = *found;
    for (auto [dtype, dim] : std::vector<std::pair<DType, std::int64_t>>{{DType::f16, 64},
                                                                          {DType::bf16, 128}})
        for (AttentionProblem p : {test::make_problem(1, 8, 2, 1, 4099, dim),
                                   test::make_problem(2, 16, 2, 65, 300, dim)}) {
            p.kv_splits = 1;
            REQUIRE(gqa_packed(p, 128).heads == p.heads_kv);  // both pack
            const std::uint64_t seed = test::next_seed();
            INFO(to_string(dtype) << " " << test::describe(p) << " seed=" << seed);
            const ProblemData in = random_problem_data(p, seed);
            const test::Outputs host = test::run_poisoned(fa3, p, in, dtype);
            Stream stream;
            Staged Q(as_bytes(in.Q, dtype, cuda::q_sign(p))), K(as_bytes(in.K, dtype));
            Staged V(as_bytes(in.V, dtype));
            Staged O(std::vector<std::uint8_t>(2 * std::size_t(p.q_elements()), 0xFF));
            for (Staged* x : {&Q, &K, &V, &O}) x->copy(stream.s);
            ForwardCall call(fa3, p, dtype, Q.data(), K.data(), V.data(), O.device.data(),
                             stream.s);
            call.a.o_dtype = dtype;  // contiguous, 16-bit: stored by TMA
            fa3.run_device(p, call.a);
            FA_CUDA_CHECK(cudaStreamSynchronize(stream.s));
            const std::vector<std::uint16_t> bits = download_bits(O);
            std::size_t wrong = 0;
            for (std::size_t x = 0; x < bits.size(); ++x)
                wrong += bits[x] != cuda::to_bits(host.O[x], dtype);
            CHECK(wrong == 0);
            CHECK(max_difference(download(call.lse), host.lse) == 0.0);
        }
}

// A 16-bit O goes out through shared memory and TMA stores where its address and strides allow
// (d <= 128, and d = 256 with Bc = 64 in two rounds of half a row), and from registers where they
// do not: the same bits either way, nothing written outside O's rows. N_q = 300 under the causal
// mask cuts the query tiles from the end (64 rows below row 0 in the first), and N_q > N_kv leaves
// rows with no visible key; the block masks (sparse_mask: a row of blocks that sees nothing) run
// the consumers' other loop, consume_block_masked, into the same epilogue.
TEST_CASE("cuda-fa3's device entry writes a 16-bit O by TMA, or from registers where TMA cannot") {
    const Backend* found = test::cuda_fa3_or_warn();
    if (!found) return;
    const Backend& fa3 = *found;
    test::ScopedEnv env("FLASHATTN_VARIANT");
    struct Case {
        DType dtype;
        std::int64_t dim;
        bool causal;
        const char* variant;  // "": the default
        bool masked;
    };
    for (const Case& c : std::vector<Case>{{DType::f16, 64, true, "", false},
                                           {DType::bf16, 128, true, "", false},
                                           {DType::bf16, 64, false, "", false},
                                           {DType::f16, 256, false, "d256-Bc64", false},
                                           {DType::bf16, 256, true, "d256-Bc64-pingpong", false},
                                           {DType::f16, 128, false, "", true},
                                           {DType::bf16, 256, true, "d256-Bc64", true}})
        for (std::int64_t heads : {4, 96}) {  // 96: more work tiles than SMs (persistent CTAs)
            const DType dtype = c.dtype;
            const std::int64_t dim = c.dim;
            env.set(*c.variant ? std::string("cuda-fa3=") + c.variant : "");
            AttentionProblem p = test::make_problem(2, heads, 2, 300, 203, dim, c.causal);
            const std::vector<std::uint8_t> mask =
                c.masked ? sparse_mask(p) : std::vector<std::uint8_t>{};
            if (c.masked) p.block_mask = {mask.data(), 8, 8};
            const std::uint64_t seed = test::next_seed();
            INFO(to_string(dtype) << " " << test::describe(p) << " variant '" << c.variant
                                  << "' mask=" << c.masked << " seed=" << seed);
            const ProblemData in = random_problem_data(p, seed);
            const test::Outputs host = test::run_poisoned(fa3, p, in, dtype);
            const Strided16 Qh = strided_copy(in.Q, p.batch, p.heads, p.seq_q, dim, dtype,
                                              cuda::q_sign(p));
            const Strided16 Kh = strided_copy(in.K, p.batch, p.heads_kv, p.seq_kv, dim, dtype);
            const Strided16 Vh = strided_copy(in.V, p.batch, p.heads_kv, p.seq_kv, dim, dtype);
            // TMA's strides; a row stride 2 elements past a multiple of 8; an address 4 bytes
            // past a 16-byte boundary.
            for (auto [row_pad, lead] : std::vector<std::pair<std::int64_t, std::int64_t>>{
                     {8, 0}, {2, 0}, {8, 2}}) {
                INFO("O's row padding " << row_pad << ", leading elements " << lead);
                const Strided16 Oh(p.batch, p.heads, p.seq_q, dim, row_pad, lead);
                Stream stream;
                Staged Q(bytes_of(Qh.host)), K(bytes_of(Kh.host)), V(bytes_of(Vh.host));
                Staged O(bytes_of(Oh.host)), mask_device(mask);
                for (Staged* x : {&Q, &K, &V, &O, &mask_device}) x->copy(stream.s);
                void* const O_at = O.device.data() + 2 * lead;  // lead 16-bit elements
                // The bits cannot tell the two paths apart; what picks one is these two rules
                // (cuda/fa3/backend.cu), so check that the first case meets them and the others
                // do not.
                CHECK((fa3::tma_aligned(O_at) && fa3::tma_layout(Oh.layout)) ==
                      (row_pad == 8 && lead == 0));
                ForwardCall call(fa3, p, dtype, Q.data(), K.data(), V.data(), O_at, stream.s);
                call.a.q_layout = Qh.layout, call.a.k_layout = Kh.layout,
                call.a.v_layout = Vh.layout;
                call.a.o_layout = Oh.layout, call.a.o_dtype = dtype;
                call.a.block_mask =
                    c.masked ? static_cast<const std::uint8_t*>(mask_device.data()) : nullptr;
                fa3.run_device(p, call.a);
                FA_CUDA_CHECK(cudaStreamSynchronize(stream.s));
                const StridedCheck o = compare_strided(download_bits(O), Oh, host.O, p.batch,
                                                       p.heads, p.seq_q, dim, dtype);
                CHECK(o.wrong == 0);
                CHECK(o.touched == 0);
                CHECK(max_difference(download(call.lse), host.lse) == 0.0);
            }
        }
}

TEST_CASE("cuda-fa3's backward device entry reads strided arrays and a 16-bit O, and writes 16-bit gradients where they lie") {
    const Backend* found = test::cuda_fa3_or_warn();
    if (!found) return;
    const Backend& fa3 = *found;
    test::ScopedEnv deterministic("FLASHATTN_DETERMINISTIC");
    deterministic.set("1");  // dQ's additions in one order: the host path's bits
    const auto check = [&](const AttentionProblem& p, DType dtype, const ProblemData& in,
                           std::uint64_t seed) {
        const std::int64_t dim = p.dim;
        const test::Outputs fwd = test::run_poisoned(fa3, p, in, dtype);
        // O as a 16-bit caller holds it; the host path gets the same values in float32, so
        // that both compute the same D = rowsum(dO o O).
        std::vector<float> O16(fwd.O.size());
        for (std::size_t k = 0; k < O16.size(); ++k)
            O16[k] = cuda::from_bits(cuda::to_bits(fwd.O[k], dtype), dtype);
        const std::vector<float> dO = random_problem_data(p, seed + 1).Q;
        std::vector<float> dQ(p.q_elements()), dK(p.kv_elements()), dV(p.kv_elements());
        run_backward(fa3, p, {in.Q.data(), in.K.data(), in.V.data(), O16.data(),
                              fwd.lse.data(), dO.data()},
                     dQ.data(), dK.data(), dV.data(), dtype);

        const std::int64_t B = p.batch, H = p.heads, Hkv = p.heads_kv;
        const Strided16 Qh = strided_copy(in.Q, B, H, p.seq_q, dim, dtype, cuda::q_sign(p));
        const Strided16 Kh = strided_copy(in.K, B, Hkv, p.seq_kv, dim, dtype);
        const Strided16 Vh = strided_copy(in.V, B, Hkv, p.seq_kv, dim, dtype);
        const Strided16 Oh = strided_copy(O16, B, H, p.seq_q, dim, dtype);
        const Strided16 dOh = strided_copy(dO, B, H, p.seq_q, dim, dtype);
        // Gradient rows 8 values apart (16 bytes: the kernel stages dK and dV in shared memory
        // and writes whole 16-byte pieces) and 2 apart (4 bytes: it stores them from registers).
        for (const std::int64_t pad : {8, 2}) {
            INFO("gradient rows padded by " << pad);
            const Strided16 dQh(B, H, p.seq_q, dim, pad), dKh(B, Hkv, p.seq_kv, dim, pad),
                dVh(B, Hkv, p.seq_kv, dim, pad);  // all 0xFFFF
            Stream stream;
            Staged Q(bytes_of(Qh.host)), K(bytes_of(Kh.host)), V(bytes_of(Vh.host));
            Staged O(bytes_of(Oh.host)), dO_d(bytes_of(dOh.host)),
                lse(as_bytes(fwd.lse, DType::f32));
            Staged dQ_d(bytes_of(dQh.host)), dK_d(bytes_of(dKh.host)), dV_d(bytes_of(dVh.host));
            for (Staged* x : {&Q, &K, &V, &O, &dO_d, &lse, &dQ_d, &dK_d, &dV_d}) x->copy(stream.s);
            Workspace workspace(fa3.device_backward_workspace_bytes(p, dtype), stream.s);
            DeviceBackward a;
            a.Q = Q.data(), a.K = K.data(), a.V = V.data(), a.dO = dO_d.data(), a.O = O.data();
            a.lse = static_cast<const float*>(lse.data());
            a.dQ = dQ_d.device.data(), a.dK = dK_d.device.data(), a.dV = dV_d.device.data();
            a.stream = stream.s, a.dtype = dtype;
            a.workspace = workspace.buffer.data(), a.workspace_bytes = workspace.bytes;
            a.q_layout = Qh.layout, a.k_layout = Kh.layout, a.v_layout = Vh.layout;
            a.o_layout = Oh.layout, a.do_layout = dOh.layout;
            a.dq_layout = dQh.layout, a.dk_layout = dKh.layout, a.dv_layout = dVh.layout;
            a.o_dtype = a.grad_dtype = dtype;
            fa3.run_backward_device(p, a);
            FA_CUDA_CHECK(cudaStreamSynchronize(stream.s));

            // The same kernel on the same values: each gradient is the host path's float32 one
            // rounded to nearest even (dQ by the post-pass, dK and dV by the kernel's stores),
            // and nothing outside the gradients' rows was written.
            const StridedCheck q = compare_strided(download_bits(dQ_d), dQh, dQ, B, H, p.seq_q,
                                                   dim, dtype);
            const StridedCheck k = compare_strided(download_bits(dK_d), dKh, dK, B, Hkv, p.seq_kv,
                                                   dim, dtype);
            const StridedCheck v = compare_strided(download_bits(dV_d), dVh, dV, B, Hkv, p.seq_kv,
                                                   dim, dtype);
            CHECK(q.wrong == 0);
            CHECK(k.wrong == 0);
            CHECK(v.wrong == 0);
            CHECK(q.touched + k.touched + v.touched == 0);

            // Refused before any work: a stride TMA cannot read, a gradient stride that breaks
            // the paired stores, a gradient type that is neither float32 nor the inputs'.
            DeviceBackward bad = a;
            bad.do_layout.row = dOh.layout.row + 4;
            CHECK_THROWS_AS(fa3.run_backward_device(p, bad), std::invalid_argument);
            bad = a;
            bad.dk_layout.head = dKh.layout.head + 1;
            CHECK_THROWS_AS(fa3.run_backward_device(p, bad), std::invalid_argument);
            bad = a;
            bad.grad_dtype = dtype == DType::f16 ? DType::bf16 : DType::f16;
            CHECK_THROWS_AS(fa3.run_backward_device(p, bad), std::invalid_argument);
        }
    };
    for_each_strided_case(check);
    // More CTAs (13 key tiles of each of 2 x 12 K/V heads: 312) than a Hopper GPU runs at once:
    // the staged dK_j, dV_j of CTAs that start as others end.
    for (bool causal : {false, true}) {
        const AttentionProblem p = test::make_problem(2, 24, 12, 113, 1600, 128, causal);
        const std::uint64_t seed = test::next_seed();
        INFO("bf16 " << test::describe(p) << " seed=" << seed);
        check(p, DType::bf16, random_problem_data(p, seed), seed);
    }
}

TEST_CASE("device entries without layouts refuse strided arrays, and a 16-bit O where they write float32") {
    for (const Case& c : forward_cases()) {
        const Backend& backend = find_backend(c.backend);
        if (backend.device_layouts) continue;
        const AttentionProblem p = test::make_problem(1, 2, 2, 33, 40, c.dim, false);
        cuda::DeviceBuffer<float> buffer(4 * p.q_elements() + 4 * p.kv_elements());
        DeviceForward a;
        a.Q = a.K = a.V = buffer.data(), a.O = buffer.data(), a.lse = buffer.data();
        a.dtype = c.dtype;
        a.q_layout = {0, 0, 8 * c.dim};
        INFO(c.backend);
        CHECK_THROWS_AS(backend.run_device(p, a), std::invalid_argument);
        a.q_layout = {};
        // A 16-bit O: refused by a backend that writes float32; one that writes the inputs'
        // dtype (device_o_dtype) refuses the other 16-bit type.
        a.o_dtype = c.dtype == DType::f16 ? DType::bf16 : DType::f16;
        CHECK_THROWS_AS(backend.run_device(p, a), std::invalid_argument);
        if (!backend.run_backward_device) continue;
        DeviceBackward g;
        g.Q = g.K = g.V = g.dO = g.O = buffer.data(), g.lse = buffer.data();
        g.dQ = g.dK = g.dV = buffer.data(), g.dtype = c.dtype;
        g.dk_layout = {0, 0, 8 * c.dim};
        CHECK_THROWS_AS(backend.run_backward_device(p, g), std::invalid_argument);
        g.dk_layout = {};
        g.grad_dtype = DType::bf16;
        CHECK_THROWS_AS(backend.run_backward_device(p, g), std::invalid_argument);
    }
}

// The backward through the device entry, everything queued behind a held stream as in the
// forward's run_forward_on_stream: dQ, dK, dV downloaded, and whether the entry waited or the
// queue was not held when it returned.
struct DeviceGradients {
    std::vector<float> dQ, dK, dV;
    bool entry_waited;
};
DeviceGradients run_backward_on_stream(const Backend& backend, const AttentionProblem& p,
                                       const ProblemData& in, const test::Outputs& fwd,
                                       const std::vector<float>& dO, DType dtype,
                                       const std::vector<std::uint8_t>& mask) {
    Stream stream;
    const cudaStream_t s = stream.s;
    const float sign = dtype == DType::f32 ? 1.0f : cuda::q_sign(p);
    Staged Q(as_bytes(in.Q, dtype, sign)), K(as_bytes(in.K, dtype));
    Staged V(as_bytes(in.V, dtype)), dO_device(as_bytes(dO, dtype));
    Staged O(as_bytes(fwd.O, DType::f32)), lse(as_bytes(fwd.lse, DType::f32));
    Staged mask_device(mask);
    cuda::DeviceBuffer<float> dQ_d(p.q_elements()), dK_d(p.kv_elements()), dV_d(p.kv_elements());
    Workspace workspace(backend.device_backward_workspace_bytes(p, dtype), s);
    for (Staged* x : {&Q, &K, &V, &dO_device, &O, &lse, &mask_device}) x->poison(s);
    for (auto* g : {&dQ_d, &dK_d, &dV_d})
        FA_CUDA_CHECK(cudaMemsetAsync(g->data(), 0xFF, g->bytes(), s));
    Hold hold;
    hold.queue(s);
    for (Staged* x : {&Q, &K, &V, &dO_device, &O, &lse, &mask_device}) x->copy(s);
    DeviceBackward a;
    a.Q = Q.data(), a.K = K.data(), a.V = V.data(), a.dO = dO_device.data();
    a.O = static_cast<const float*>(O.data());
    a.lse = static_cast<const float*>(lse.data());
    a.dQ = dQ_d.data(), a.dK = dK_d.data(), a.dV = dV_d.data();
    a.stream = s, a.dtype = dtype;
    a.workspace = workspace.buffer.data(), a.workspace_bytes = workspace.bytes;
    a.block_mask = p.block_mask.active() ? mask_device.device.data() : nullptr;
    backend.run_backward_device(p, a);
    const bool waited = hold.release_after_entry(s);
    return {download(dQ_d), download(dK_d), download(dV_d), waited};
}

TEST_CASE("device backward entries queue behind the caller's stream and match the host path") {
    struct BackwardCase {
        std::string backend;
        DType dtype;
        std::int64_t dim;
    };
    const std::vector<BackwardCase> cases = {{"cuda-fa2", DType::f32, 64},
                                             {"cuda-fa2", DType::f32, 8},
                                             {"cuda-tc", DType::f16, 64},
                                             {"cuda-tc", DType::bf16, 128}};
    std::vector<BackwardCase> all = cases;
    if (fa3::fa3_available()) {
        all.push_back({"cuda-fa3", DType::bf16, 64});
        all.push_back({"cuda-fa3", DType::f16, 128});
    }
    test::ScopedEnv deterministic("FLASHATTN_DETERMINISTIC");
    for (const std::string& mode : std::vector<std::string>{"0", "1"}) {
        deterministic.set(mode);
        for (const BackwardCase& c : all)
            for (bool causal : {false, true})
                for (bool masked : {false, true}) {
                    const Backend& backend = find_backend(c.backend);
                    REQUIRE(backend.run_backward_device);
                    AttentionProblem p = test::make_problem(2, 4, 2, 113, 203, c.dim, causal);
                    const std::vector<std::uint8_t> mask = masked ? sparse_mask(p) : std::vector<std::uint8_t>{};
                    if (masked) p.block_mask = {mask.data(), 8, 8};
                    const std::uint64_t seed = test::next_seed();
                    INFO(c.backend << " " << to_string(c.dtype) << " " << test::describe(p)
                                   << " mask=" << masked << " deterministic=" << mode
                                   << " seed=" << seed);
                    const ProblemData in = random_problem_data(p, seed);
                    const test::Outputs fwd = test::run_poisoned(backend, p, in, c.dtype);
                    const std::vector<float> dO = random_problem_data(p, seed + 1).Q;
                    const BackwardInputs host_in{in.Q.data(), in.K.data(), in.V.data(),
                                                 fwd.O.data(), fwd.lse.data(), dO.data()};
                    std::vector<float> dQ(p.q_elements()), dK(p.kv_elements()), dV(p.kv_elements());
                    run_backward(backend, p, host_in, dQ.data(), dK.data(), dV.data(), c.dtype);
                    const DeviceGradients device =
                        run_backward_on_stream(backend, p, in, fwd, dO, c.dtype, mask);
                    CHECK_FALSE(device.entry_waited);
                    // dQ is summed with atomics (in an order that may change) unless
                    // deterministic: equal up to rounding; dK and dV have one order.
                    const double dq_tolerance = mode == "1" ? 0.0 : 1e-5 * (1.0 + max_abs(dQ));
                    CHECK(max_difference(device.dQ, dQ) <= dq_tolerance);
                    CHECK(max_difference(device.dK, dK) == 0.0);
                    CHECK(max_difference(device.dV, dV) == 0.0);
                }
    }
}

// On a small problem (up to 2^30 FLOPs) cuda-fa2's forward (host path and device entry alike) runs
// its 3xTF32 kernel in the mode that looks at every value it splits: a query tile whose inputs hold
// a value the tf32 split cannot carry (a NaN, an inf, or a finite value the split rounds to inf) is
// computed by the FFMA kernel's code in the same CTA (cuda/fa2/kernel_tf32.cuh). So exactly the query tiles that loaded the value get the
// FFMA kernel's bits (the forced FFMA configuration of the same rows, threads and Bc), and every
// other tile the tensor-core kernel's bits on the input without it -- which differ from the FFMA
// kernel's in every finite row, so the rule shows. The device entry must give the host path's
// bits without waiting.
TEST_CASE("cuda-fa2's forward computes exactly the query tiles that loaded a NaN, inf or huge value with its FFMA code") {
    const Backend& fa2 = find_backend("cuda-fa2");
    const test::ScopedEnv variant("FLASHATTN_VARIANT");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    // The NaN a GPU's arithmetic makes (all mantissa bits set), which the split's rounding would
    // turn into 0, and the largest float, which it would round to inf.
    const float gpu_nan = [] {
        const std::uint32_t bits = 0x7fffffffu;
        float x;
        std::memcpy(&x, &bits, sizeof x);
        return x;
    }();
    const float huge = std::numeric_limits<float>::max();
    constexpr std::int64_t Br = 128, Bc = 64;  // the default tensor-core tiles (cuda/fa2/backend.cu)
    struct Dim {
        std::int64_t d;
        const char* ffma;  // the FFMA configuration a fallback tile runs (Tf32Tile::Ffma)
    };
    for (const Dim dim : {Dim{64, "d64_128x32_2b"}, Dim{100, "d128_128x32"}})
        for (bool causal : {false, true}) {
            // 3 query tiles (the last ragged), 4 key tiles (the last ragged), GQA groups of 2;
            // causal bottom-right: query tile 0 loads key tile 0 only (its rows 0-96 see no key),
            // tile 1 key tiles 0-2. Query tile 2 has rows for its first 3 warps only: K's poked
            // column (d - 1) is looked at by warp 3 (d = 64) or 6 (d = 100), which skips the
            // products there, so that tile finds it only through Ops::inspect_skipped.
            const AttentionProblem p = test::make_problem(2, 4, 2, 300, 203, dim.d, causal);
            REQUIRE(p.forward_flops() <= double(std::int64_t{1} << 30));  // the one-launch size
            const std::int64_t d = p.dim, group = p.heads / p.heads_kv;
            struct Poke {
                const char* where;
                int array;  // 0 Q, 1 K, 2 V
                std::int64_t b, head, row, col;
                float value;
            };
            for (const Poke& poke : {Poke{"Q = NaN (b 1, h 2, row 5)", 0, 1, 2, 5, 3, nan},
                                     Poke{"Q = the GPU's NaN (b 0, h 3, row 299)", 0, 0, 3, 299, 0, gpu_nan},
                                     Poke{"K = inf (b 0, kv head 1, key 101)", 1, 0, 1, 101, d - 1, inf},
                                     Poke{"V = -inf (b 1, kv head 0, key 202)", 2, 1, 0, 202, 7, -inf},
                                     Poke{"V = FLT_MAX (b 0, kv head 0, key 70)", 2, 0, 0, 70, 1, huge}}) {
                const std::uint64_t seed = test::next_seed();
                INFO(test::describe(p) << " " << poke.where << " seed=" << seed);
                const ProblemData clean = random_problem_data(p, seed);
                ProblemData in = clean;
                const bool on_q = poke.array == 0;
                std::vector<float>& x = on_q ? in.Q : poke.array == 1 ? in.K : in.V;
                const std::int64_t head_offset = on_q ? p.q_offset(poke.b, poke.head)
                                                      : p.kv_offset(poke.b, poke.head * group);
                x[static_cast<std::size_t>(head_offset + poke.row * d + poke.col)] = poke.value;

                variant.set("cuda-fa2=tf32");
                const test::Outputs tf32_clean = test::run_poisoned(fa2, p, clean, DType::f32);
                const test::Outputs host = test::run_poisoned(fa2, p, in, DType::f32);
                variant.set(std::string("cuda-fa2=") + dim.ffma);
                const test::Outputs ffma = test::run_poisoned(fa2, p, in, DType::f32);
                // The two kernels' bits differ (on the clean input): a kernel that took the FFMA
                // code everywhere, or nowhere, would fail the checks below.
                REQUIRE(max_difference(test::run_poisoned(fa2, p, clean, DType::f32).O,
                                       tf32_clean.O) > 0.0);

                int fallback_tiles = 0;
                for (std::int64_t b = 0; b < p.batch; ++b)
                    for (std::int64_t h = 0; h < p.heads; ++h)
                        for (std::int64_t i = 0; i * Br < p.seq_q; ++i) {
                            const TileRange rows = tile_range(i, Br, p.seq_q);
                            // Did this CTA load the poked value? Q: its own rows; K, V: the key
                            // tiles up to its causal diagonal, of its KV head.
                            const bool loaded =
                                b == poke.b &&
                                (on_q ? h == poke.head && rows.begin <= poke.row &&
                                            poke.row < rows.end
                                      : h / group == poke.head &&
                                            poke.row / Bc < causal_key_tiles(p, rows, Bc).seen);
                            fallback_tiles += loaded;
                            const test::Outputs& want = loaded ? ffma : tf32_clean;
                            const std::int64_t first = p.q_offset(b, h) + rows.begin * d;
                            const std::int64_t lse_first = p.lse_offset(b, h) + rows.begin;
                            const auto slice = [](const std::vector<float>& v, std::int64_t at,
                                                  std::int64_t n) {
                                return std::vector<float>(v.begin() + at, v.begin() + at + n);
                            };
                            INFO("b " << b << " h " << h << " query tile " << i
                                      << (loaded ? " (loaded it: the FFMA code)" : ""));
                            CHECK(max_difference(slice(host.O, first, rows.size() * d),
                                                 slice(want.O, first, rows.size() * d)) == 0.0);
                            CHECK(max_difference(slice(host.lse, lse_first, rows.size()),
                                                 slice(want.lse, lse_first, rows.size())) == 0.0);
                        }
                CHECK(fallback_tiles >= 1);

                variant.set("cuda-fa2=tf32");
                const DeviceOutputs device = run_forward_on_stream(fa2, p, in, DType::f32, {});
                CHECK_FALSE(device.entry_waited);
                CHECK(max_difference(device.O, host.O) == 0.0);
                CHECK(max_difference(device.lse, host.lse) == 0.0);
            }
        }
}

// On a larger problem cuda-fa2's forward runs behind a test of its inputs: the host path looks at
// them and runs the FFMA kernel where one holds a NaN or inf; the device entry queues both kernels
// behind a test on the device, whose CTAs each write a flag. One non-finite value anywhere (the
// first element of Q, the middle of K, the last of V) must select the FFMA kernel: the host path's
// bits, which the 3xTF32 kernel's differ from in every finite row.
TEST_CASE("cuda-fa2's forward on a larger problem runs the FFMA kernel wherever an input is not finite, on both paths") {
    const Backend& fa2 = find_backend("cuda-fa2");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    for (bool causal : {false, true}) {
        const AttentionProblem p = test::make_problem(1, 4, 2, 1100, 1300, 64, causal);
        REQUIRE(p.forward_flops() > double(std::int64_t{1} << 30));  // past the one-launch size
        const std::int64_t nkv = p.kv_elements();
        struct Poke {
            const char* where;
            int array;  // 0 Q, 1 K, 2 V
            std::int64_t index;
            float value;
        };
        for (const Poke& poke : {Poke{"Q[0] = NaN", 0, 0, nan}, Poke{"K[mid] = inf", 1, nkv / 2, inf},
                                 Poke{"V[last] = -inf", 2, nkv - 1, -inf}}) {
            const std::uint64_t seed = test::next_seed();
            INFO(test::describe(p) << " " << poke.where << " seed=" << seed);
            ProblemData in = random_problem_data(p, seed);
            const test::Outputs tf32 = test::run_poisoned(fa2, p, in, DType::f32);
            std::vector<float>& x = poke.array == 0 ? in.Q : poke.array == 1 ? in.K : in.V;
            x[static_cast<std::size_t>(poke.index)] = poke.value;
            const test::Outputs host = test::run_poisoned(fa2, p, in, DType::f32);
            REQUIRE(max_abs(host.O) > 0.0);  // finite rows to compare, not only NaN
            // The FFMA kernel ran everywhere: rows 1 to 1099 of head 0 see none of the poked
            // values (Q's is row 0, K's and V's are in KV head 1), yet they no longer hold the
            // 3xTF32 kernel's bits.
            const std::int64_t first = p.q_offset(0, 0) + p.dim, end = p.q_offset(0, 1);
            CHECK(max_difference(std::vector<float>(host.O.begin() + first, host.O.begin() + end),
                                 std::vector<float>(tf32.O.begin() + first, tf32.O.begin() + end)) > 0.0);
            const DeviceOutputs device = run_forward_on_stream(fa2, p, in, DType::f32, {});
            CHECK_FALSE(device.entry_waited);
            CHECK(max_difference(device.O, host.O) == 0.0);
            CHECK(max_difference(device.lse, host.lse) == 0.0);
        }
    }
}

// cuda-fa2's backward: the host path looks at the inputs and runs the FFMA kernels where one of them
// holds a NaN or inf (cuda/host/tensor_core_eligibility.hpp says why); its device entry queues
// both kernels behind a test on the device, whose CTAs each write a flag. One non-finite value
// anywhere (the first element of Q, the middle of K, the last of V, the last of dO or of O) must
// select the FFMA kernels: the host path's bits, which the 3xTF32 kernel's differ from in every
// finite row. The finite case (the tensor-core kernel) is the tests above.
TEST_CASE("cuda-fa2's backward device entry runs the FFMA kernels wherever an input is not finite, as the host path does") {
    const Backend& fa2 = find_backend("cuda-fa2");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    // The third problem's arrays hold an odd number of values (d = 37, three heads): their last
    // ones lie past the test's 16-byte loads, where it reads one value at a time. Its K/V heads
    // are three, so that an inf in one head's K leaves the other heads' gradients finite.
    for (const AttentionProblem& p : {test::make_problem(2, 4, 2, 113, 203, 64, false),
                                      test::make_problem(2, 4, 2, 113, 203, 64, true),
                                      test::make_problem(1, 3, 3, 113, 203, 37, true)}) {
        const std::int64_t nq = p.q_elements(), nkv = p.kv_elements();
        struct Poke {
            const char* where;
            int array;  // 0 Q, 1 K, 2 V, 3 dO, 4 O
            std::int64_t index;
            float value;
        };
        for (const Poke& poke : {Poke{"Q[0] = NaN", 0, 0, nan}, Poke{"K[mid] = inf", 1, nkv / 2, inf},
                                 Poke{"V[last] = -inf", 2, nkv - 1, -inf},
                                 Poke{"dO[last] = NaN", 3, nq - 1, nan},
                                 Poke{"O[last] = inf", 4, nq - 1, inf}}) {
            const std::uint64_t seed = test::next_seed();
            INFO(test::describe(p) << " " << poke.where << " seed=" << seed);
            ProblemData in = random_problem_data(p, seed);
            std::vector<float> dO = random_problem_data(p, seed + 1).Q;
            if (poke.array < 3) {
                std::vector<float>& x = poke.array == 0 ? in.Q : poke.array == 1 ? in.K : in.V;
                x[static_cast<std::size_t>(poke.index)] = poke.value;
            }
            test::Outputs fwd = test::run_poisoned(fa2, p, in, DType::f32);
            REQUIRE(max_abs(fwd.O) > 0.0);  // finite rows to compare, not only NaN
            if (poke.array == 3) dO[static_cast<std::size_t>(poke.index)] = poke.value;
            if (poke.array == 4) fwd.O[static_cast<std::size_t>(poke.index)] = poke.value;
            std::vector<float> dQ(nq), dK(nkv), dV(nkv);
            run_backward(fa2, p, {in.Q.data(), in.K.data(), in.V.data(), fwd.O.data(),
                                  fwd.lse.data(), dO.data()},
                         dQ.data(), dK.data(), dV.data(), DType::f32);
            REQUIRE(max_abs(dK) > 0.0);
            const DeviceGradients device = run_backward_on_stream(fa2, p, in, fwd, dO, DType::f32, {});
            CHECK_FALSE(device.entry_waited);
            // The FFMA backward sums dQ in one order (no atomics): the same bits.
            CHECK(max_difference(device.dQ, dQ) == 0.0);
            CHECK(max_difference(device.dK, dK) == 0.0);
            CHECK(max_difference(device.dV, dV) == 0.0);
        }
    }
}

namespace {

// A (batch, heads, rows, d) float32 array laid out as (batch, rows, heads, d) -- the order of q, k
// and v cut from one projection -- with head_pad unused floats after each head's d values,
// row_pad after each row of heads and 4 after each batch entry, so that every stride differs
// from the contiguous one. Unused elements hold `fill`.
struct StridedF32 {
    ArrayLayout layout;
    std::vector<float> host;
    StridedF32(std::int64_t batch, std::int64_t heads, std::int64_t rows, std::int64_t d,
               std::int64_t head_pad, std::int64_t row_pad, float fill) {
        const std::int64_t head = d + head_pad, row = heads * head + row_pad;
        layout = {rows * row + 4, head, row};
        host.assign(static_cast<std::size_t>(batch * layout.batch), fill);
    }
    std::size_t at(std::int64_t b, std::int64_t h, std::int64_t r, std::int64_t c) const {
        return static_cast<std::size_t>(layout.offset(b, h) + r * layout.row + c);
    }
};

// An input: the contiguous x in a StridedF32 with rows 4 floats (16 bytes) apart from the next
// head's, unused elements `fill`.
StridedF32 strided_input(const std::vector<float>& x, std::int64_t batch, std::int64_t heads,
                         std::int64_t rows, std::int64_t d, float fill) {
    StridedF32 out(batch, heads, rows, d, 0, 4, fill);
    for_each_element(batch, heads, rows, d, [&](auto b, auto h, auto r, auto c, std::size_t i) {
        out.host[out.at(b, h, r, c)] = x[i];
    });
    return out;
}

// An output: NaN everywhere, strides even (the kernels store pairs of floats) but rows 2 floats
// apart from the next head's (so not 16 bytes: the FFMA kernel's 16-byte stores give way).
StridedF32 strided_output(std::int64_t batch, std::int64_t heads, std::int64_t rows,
                          std::int64_t d) {
    return StridedF32(batch, heads, rows, d, d % 2, 2, std::numeric_limits<float>::quiet_NaN());
}

// How many values of the output `got` (downloaded) differ from the contiguous `expect`, bit for
// bit, and how many elements outside its rows were written (they must stay NaN).
StridedCheck compare_f32(const std::vector<float>& got, const StridedF32& at,
                         const std::vector<float>& expect, std::int64_t batch, std::int64_t heads,
                         std::int64_t rows, std::int64_t d) {
    StridedCheck out;
    std::vector<bool> inside(got.size(), false);
    for_each_element(batch, heads, rows, d, [&](auto b, auto h, auto r, auto c, std::size_t i) {
        const std::size_t k = at.at(b, h, r, c);
        inside[k] = true;
        out.wrong += std::memcmp(&got[k], &expect[i], sizeof(float)) != 0;
    });
    for (std::size_t k = 0; k < got.size(); ++k) out.touched += !inside[k] && !std::isnan(got[k]);
    return out;
}

cuda::DeviceBuffer<float> on_device(const std::vector<float>& x) {
    cuda::DeviceBuffer<float> out(x.size());
    out.upload(x.data());
    return out;
}

// The problems of the strided float32 tests, each with fresh random inputs: ragged N_q and N_kv,
// GQA; the 3xTF32 kernels with 16-byte copies (d = 64: a small problem, whose forward looks at
// its own inputs, and a larger one, whose forward runs behind the finiteness test) and value by
// value (d = 37), and the FFMA kernels (d = 160).
std::vector<AttentionProblem> strided_f32_problems() {
    return {test::make_problem(2, 4, 2, 113, 203, 64, false),
            test::make_problem(2, 4, 2, 113, 203, 64, true),
            test::make_problem(1, 3, 3, 77, 150, 37, true),
            test::make_problem(2, 8, 4, 700, 900, 64, true),
            test::make_problem(1, 2, 1, 77, 150, 160, false)};
}

}  // namespace

// cuda-fa2 reads Q, K, V (and dO, O) and writes O and the gradients where their layouts put them:
// the same kernels on the same values as the host path's contiguous arrays, so the same bits, and
// nothing written outside the outputs' rows. The inputs' unused elements are finite here: the
// finiteness test reads between rows (FloatSpan), and a NaN there sends the call to the FFMA
// kernels, which the last part checks.
TEST_CASE("cuda-fa2's device entries read and write strided float32 arrays where they lie") {
    const Backend& fa2 = find_backend("cuda-fa2");
    REQUIRE(fa2.device_layouts);
    test::ScopedEnv deterministic("FLASHATTN_DETERMINISTIC");
    deterministic.set("1");  // dQ's additions in one order: the host path's bits
    for (const AttentionProblem& p : strided_f32_problems()) {
        const std::uint64_t seed = test::next_seed();
        INFO(test::describe(p) << " seed=" << seed);
        const ProblemData in = random_problem_data(p, seed);
        const std::vector<float> dO = random_problem_data(p, seed + 1).Q;
        const std::int64_t B = p.batch, H = p.heads, Hkv = p.heads_kv, d = p.dim;
        const test::Outputs host = test::run_poisoned(fa2, p, in, DType::f32);
        std::vector<float> dQ(p.q_elements()), dK(p.kv_elements()), dV(p.kv_elements());
        run_backward(fa2, p, {in.Q.data(), in.K.data(), in.V.data(), host.O.data(),
                              host.lse.data(), dO.data()},
                     dQ.data(), dK.data(), dV.data(), DType::f32);

        const StridedF32 Qh = strided_input(in.Q, B, H, p.seq_q, d, 0.5f);
        const StridedF32 Kh = strided_input(in.K, B, Hkv, p.seq_kv, d, 0.5f);
        const StridedF32 Vh = strided_input(in.V, B, Hkv, p.seq_kv, d, 0.5f);
        const StridedF32 Oh = strided_output(B, H, p.seq_q, d);
        Stream stream;
        auto Q = on_device(Qh.host), K = on_device(Kh.host), V = on_device(Vh.host);
        auto O = on_device(Oh.host);
        ForwardCall call(fa2, p, DType::f32, Q.data(), K.data(), V.data(), O.data(), stream.s);
        DeviceForward& a = call.a;
        a.q_layout = Qh.layout, a.k_layout = Kh.layout, a.v_layout = Vh.layout;
        a.o_layout = Oh.layout;
        fa2.run_device(p, a);
        FA_CUDA_CHECK(cudaStreamSynchronize(stream.s));
        const StridedCheck o = compare_f32(download(O), Oh, host.O, B, H, p.seq_q, d);
        CHECK(o.wrong == 0);
        CHECK(o.touched == 0);
        CHECK(max_difference(download(call.lse), host.lse) == 0.0);

        // The backward on the host path's O (its float32 values, strided like dO).
        const StridedF32 Oin = strided_input(host.O, B, H, p.seq_q, d, 0.5f);
        const StridedF32 dOh = strided_input(dO, B, H, p.seq_q, d, 0.5f);
        const StridedF32 dQh = strided_output(B, H, p.seq_q, d);
        const StridedF32 dKh = strided_output(B, Hkv, p.seq_kv, d);
        const StridedF32 dVh = strided_output(B, Hkv, p.seq_kv, d);
        auto O_in = on_device(Oin.host), dO_d = on_device(dOh.host), lse = on_device(host.lse);
        auto dQ_d = on_device(dQh.host), dK_d = on_device(dKh.host), dV_d = on_device(dVh.host);
        Workspace workspace(fa2.device_backward_workspace_bytes(p, DType::f32), stream.s);
        DeviceBackward g;
        g.Q = Q.data(), g.K = K.data(), g.V = V.data(), g.O = O_in.data(), g.dO = dO_d.data();
        g.lse = lse.data(), g.dQ = dQ_d.data(), g.dK = dK_d.data(), g.dV = dV_d.data();
        g.stream = stream.s, g.dtype = DType::f32;
        g.workspace = workspace.buffer.data(), g.workspace_bytes = workspace.bytes;
        g.q_layout = Qh.layout, g.k_layout = Kh.layout, g.v_layout = Vh.layout;
        g.o_layout = Oin.layout, g.do_layout = dOh.layout;
        g.dq_layout = dQh.layout, g.dk_layout = dKh.layout, g.dv_layout = dVh.layout;
        fa2.run_backward_device(p, g);
        FA_CUDA_CHECK(cudaStreamSynchronize(stream.s));
        const StridedCheck q = compare_f32(download(dQ_d), dQh, dQ, B, H, p.seq_q, d);
        const StridedCheck k = compare_f32(download(dK_d), dKh, dK, B, Hkv, p.seq_kv, d);
        const StridedCheck v = compare_f32(download(dV_d), dVh, dV, B, Hkv, p.seq_kv, d);
        CHECK(q.wrong == 0);
        CHECK(k.wrong == 0);
        CHECK(v.wrong == 0);
        CHECK(q.touched + k.touched + v.touched == 0);

        // Refused before any work: an input's head stride that breaks its 16-byte copies (where
        // d allows them), an output's row stride that its stores cannot take (odd where an even d
        // stores pairs, negative at any d), an O of another type.
        const auto bad_row = [d](std::int64_t row) { return d % 2 == 0 ? row + 1 : -row; };
        if (d % 4 == 0) {
            DeviceForward bad = a;
            bad.k_layout.head = Kh.layout.head + 1;
            CHECK_THROWS_AS(fa2.run_device(p, bad), std::invalid_argument);
            DeviceBackward bad_g = g;
            bad_g.do_layout.batch = dOh.layout.batch + 2;
            CHECK_THROWS_AS(fa2.run_backward_device(p, bad_g), std::invalid_argument);
        }
        DeviceForward bad = a;
        bad.o_layout.row = bad_row(Oh.layout.row);
        CHECK_THROWS_AS(fa2.run_device(p, bad), std::invalid_argument);
        bad = a;
        bad.o_dtype = DType::bf16;
        CHECK_THROWS_AS(fa2.run_device(p, bad), std::invalid_argument);
        DeviceBackward bad_g = g;
        bad_g.dv_layout.row = bad_row(dVh.layout.row);
        CHECK_THROWS_AS(fa2.run_backward_device(p, bad_g), std::invalid_argument);
    }
}

// A NaN among the unused elements between the rows of a strided input is inside the span the
// finiteness test reads: the call runs the FFMA kernels, whose answer is the host path's with the
// FFMA kernel asked for (FLASHATTN_VARIANT=cuda-fa2=ffma), bit for bit.
TEST_CASE("cuda-fa2's forward device entry: a NaN between the rows of a strided input selects the FFMA kernel, whose answer is the same") {
    const Backend& fa2 = find_backend("cuda-fa2");
    const AttentionProblem p = test::make_problem(2, 8, 4, 700, 900, 64, true);  // tested on device
    const std::uint64_t seed = test::next_seed();
    INFO(test::describe(p) << " seed=" << seed);
    const ProblemData in = random_problem_data(p, seed);
    test::Outputs ffma;
    {
        test::ScopedEnv variant("FLASHATTN_VARIANT");
        variant.set("cuda-fa2=ffma");
        ffma = test::run_poisoned(fa2, p, in, DType::f32);
    }
    const test::Outputs tf32 = test::run_poisoned(fa2, p, in, DType::f32);
    REQUIRE(max_difference(ffma.O, tf32.O) > 0.0);  // the two kernels' bits differ
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::int64_t B = p.batch, H = p.heads, Hkv = p.heads_kv, d = p.dim;
    const StridedF32 Qh = strided_input(in.Q, B, H, p.seq_q, d, 0.5f);
    const StridedF32 Kh = strided_input(in.K, B, Hkv, p.seq_kv, d, nan);
    const StridedF32 Vh = strided_input(in.V, B, Hkv, p.seq_kv, d, 0.5f);
    const StridedF32 Oh = strided_output(B, H, p.seq_q, d);
    Stream stream;
    auto Q = on_device(Qh.host), K = on_device(Kh.host), V = on_device(Vh.host);
    auto O = on_device(Oh.host);
    ForwardCall call(fa2, p, DType::f32, Q.data(), K.data(), V.data(), O.data(), stream.s);
    call.a.q_layout = Qh.layout, call.a.k_layout = Kh.layout, call.a.v_layout = Vh.layout;
    call.a.o_layout = Oh.layout;
    fa2.run_device(p, call.a);
    FA_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    const StridedCheck o = compare_f32(download(O), Oh, ffma.O, B, H, p.seq_q, d);
    CHECK(o.wrong == 0);
    CHECK(o.touched == 0);
    CHECK(max_difference(download(call.lse), ffma.lse) == 0.0);
}

TEST_CASE("cuda-fa3's backward device entry adds into a float32 dQ 8- but not 16-byte aligned") {
    // The kernel adds to dQ's float32 sum with TMA, which needs a 16-byte aligned address: a dense
    // float32 dQ two floats past an aligned address must still get the host path's bits (through
    // the working sum), and the floats before it must stay as they were.
    const Backend* found = test::cuda_fa3_or_warn();
    if (!found) return;
    const Backend& fa3 = *found;
    test::ScopedEnv deterministic("FLASHATTN_DETERMINISTIC");
    deterministic.set("1");  // one order of dQ's additions: the host path's bits
    for (const std::int64_t dim : {64, 128}) {
        const AttentionProblem p = test::make_problem(1, 4, 2, 77, 150, dim, true);
        const std::uint64_t seed = test::next_seed();
        INFO(test::describe(p) << " seed=" << seed);
        const DType dtype = DType::bf16;
        const ProblemData in = random_problem_data(p, seed);
        const test::Outputs fwd = test::run_poisoned(fa3, p, in, dtype);
        const std::vector<float> dO = random_problem_data(p, seed + 1).Q;
        std::vector<float> dQ(p.q_elements()), dK(p.kv_elements()), dV(p.kv_elements());
        run_backward(fa3, p, {in.Q.data(), in.K.data(), in.V.data(), fwd.O.data(),
                              fwd.lse.data(), dO.data()},
                     dQ.data(), dK.data(), dV.data(), dtype);

        Stream stream;
        const cudaStream_t s = stream.s;
        Staged Q(as_bytes(in.Q, dtype, cuda::q_sign(p))), K(as_bytes(in.K, dtype));
        Staged V(as_bytes(in.V, dtype)), dO_d(as_bytes(dO, dtype));
        Staged O(as_bytes(fwd.O, DType::f32)), lse(as_bytes(fwd.lse, DType::f32));
        cuda::DeviceBuffer<float> dQ_d(p.q_elements() + 2), dK_d(p.kv_elements()),
            dV_d(p.kv_elements());
        for (auto* g : {&dQ_d, &dK_d, &dV_d})
            FA_CUDA_CHECK(cudaMemsetAsync(g->data(), 0xFF, g->bytes(), s));
        for (Staged* x : {&Q, &K, &V, &dO_d, &O, &lse}) x->copy(s);
        Workspace workspace(fa3.device_backward_workspace_bytes(p, dtype), s);
        DeviceBackward a;
        a.Q = Q.data(), a.K = K.data(), a.V = V.data(), a.dO = dO_d.data();
        a.O = static_cast<const float*>(O.data());
        a.lse = static_cast<const float*>(lse.data());
        a.dQ = dQ_d.data() + 2, a.dK = dK_d.data(), a.dV = dV_d.data();
        a.stream = s, a.dtype = dtype;
        a.workspace = workspace.buffer.data(), a.workspace_bytes = workspace.bytes;
        fa3.run_backward_device(p, a);
        FA_CUDA_CHECK(cudaStreamSynchronize(s));
        const std::vector<float> got = download(dQ_d);
        std::uint32_t guard[2];
        std::memcpy(guard, got.data(), 8);
        CHECK(guard[0] == 0xFFFFFFFFu);
        CHECK(guard[1] == 0xFFFFFFFFu);
        CHECK(max_difference(std::vector<float>(got.begin() + 2, got.end()), dQ) == 0.0);
        CHECK(max_difference(download(dK_d), dK) == 0.0);
        CHECK(max_difference(download(dV_d), dV) == 0.0);
    }
}

TEST_CASE("device entries refuse a workspace smaller than device_workspace_bytes, or misaligned") {
    const AttentionProblem p = test::make_problem(1, 2, 2, 64, 64, 64, false);
    struct Entry {
        std::string backend;
        DType dtype;
        bool backward;
    };
    std::vector<Entry> entries = {{"cuda-fa2", DType::f32, true}, {"cuda-tc", DType::f16, true}};
    // (cuda-fa2's and cuda-fa3's forwards need none at this size: their own tests.)
    cuda::DeviceBuffer<std::uint16_t> Q(p.q_elements()), K(p.kv_elements()), V(p.kv_elements());
    cuda::DeviceBuffer<float> O(p.q_elements()), lse(p.lse_elements()), dQ(p.q_elements()),
        dK(p.kv_elements()), dV(p.kv_elements());
    cuda::DeviceBuffer<float> f32_in(3 * p.q_elements());
    for (const Entry& e : entries) {
        INFO(e.backend << (e.backward ? " backward" : " forward"));
        const Backend& backend = find_backend(e.backend);
        const std::size_t need = e.backward ? backend.device_backward_workspace_bytes(p, e.dtype)
                                            : backend.device_workspace_bytes(p, e.dtype);
        REQUIRE(need > 0);
        CHECK(need % 256 == 0);
        cuda::DeviceBuffer<std::uint8_t> workspace(need + 256);
        const void* in = e.dtype == DType::f32 ? static_cast<const void*>(f32_in.data()) : Q.data();
        const auto call = [&](void* base, std::size_t bytes) {
            if (e.backward) {
                DeviceBackward a;
                a.Q = in, a.K = in, a.V = in, a.dO = in, a.O = O.data(), a.lse = lse.data();
                a.dQ = dQ.data(), a.dK = dK.data(), a.dV = dV.data(), a.dtype = e.dtype;
                a.workspace = base, a.workspace_bytes = bytes;
                backend.run_backward_device(p, a);
            } else {
                DeviceForward a;
                a.Q = in, a.K = in, a.V = in, a.O = O.data(), a.lse = lse.data(), a.dtype = e.dtype;
                a.workspace = base, a.workspace_bytes = bytes;
                backend.run_device(p, a);
            }
        };
        CHECK_THROWS_AS(call(workspace.data(), need - 1), std::invalid_argument);
        CHECK_THROWS_WITH(call(workspace.data(), need - 1),
                          Catch::Contains("workspace_bytes = " + std::to_string(need - 1)));
        CHECK_THROWS_WITH(call(workspace.data(), need - 1),
                          Catch::Contains("at least " + std::to_string(need) + " bytes"));
        CHECK_THROWS_AS(call(nullptr, 0), std::invalid_argument);
        CHECK_THROWS_AS(call(workspace.data() + 16, need), std::invalid_argument);
        CHECK_NOTHROW(call(workspace.data(), need));
    }
    FA_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("device entries need the block mask on the device when the problem has one") {
    AttentionProblem p = test::make_problem(1, 1, 1, 16, 16, 64, false);
    const std::vector<std::uint8_t> mask(4, 1);
    p.block_mask = {mask.data(), 8, 8};
    const Backend& backend = find_backend("cuda-tc");
    cuda::DeviceBuffer<std::uint16_t> X(p.q_elements());
    cuda::DeviceBuffer<float> O(p.q_elements()), lse(p.lse_elements());
    DeviceForward a;
    a.Q = X.data(), a.K = X.data(), a.V = X.data(), a.O = O.data(), a.lse = lse.data();
    a.dtype = DType::f16;
    CHECK_THROWS_AS(backend.run_device(p, a), std::invalid_argument);  // no device copy
    p.block_mask = {};
    a.block_mask = reinterpret_cast<const std::uint8_t*>(X.data());
    CHECK_THROWS_AS(backend.run_device(p, a), std::invalid_argument);  // a copy of no mask
}

// A row whose every visible score overflows float32 gets NaN (what float32 standard attention
// gives it), and a row with no visible key O = 0, LSE = -inf, in the same call. Built so the
// kernels meet the overflow in the scores they form: raw q.k = -inf (|q| = |k| = 2e19, float32
// and bf16 hold them) or, for f16 (which cannot), |scale| so large that scale q.k of the row
// passes float32's range. Causal with N_q > N_kv hides every key from rows 0 .. N_q - N_kv - 1,
// and the block mask's third row of blocks hides rows 16 .. 23.
TEST_CASE("device entries mark a row whose scores overflow NaN, and keep O = 0, LSE = -inf for a fully masked row") {
    // (N_kv, kv_splits, masked): the last forces split-KV where a backend splits (cuda-tc: 4 key
    // tiles in 3 chunks), whose chunks hold none of some rows' keys: the test must wait for the
    // merge (cuda/stages/combine.cuh).
    struct Config {
        std::int64_t seq_kv, kv_splits;
        bool masked;
    };
    for (const Case& c : forward_cases()) {
        const Backend& backend = find_backend(c.backend);
        for (const Config& config : {Config{24, 0, false}, Config{24, 0, true}, Config{200, 3, true}}) {
            const bool masked = config.masked;
            AttentionProblem p = test::make_problem(1, 2, 1, 40, config.seq_kv, c.dim, true);
            p.kv_splits = config.kv_splits;
            const std::vector<std::uint8_t> mask = sparse_mask(p);
            if (masked) p.block_mask = {mask.data(), 8, 8};
            const std::int64_t overflow_row = 30, empty_row = masked ? 20 : 5;
            REQUIRE(p.row_has_visible_key(overflow_row));
            REQUIRE_FALSE(p.row_has_visible_key(empty_row));
            ProblemData in = random_problem_data(p, test::next_seed());
            const std::int64_t d = p.dim;
            const bool by_scale = c.dtype == DType::f16;
            for (std::int64_t j = 0; j < p.batch * p.heads_kv * p.seq_kv; ++j)
                for (std::int64_t k = 0; k < d; ++k) in.K[j * d + k] = k == 0 ? (by_scale ? 1.0f : 2e19f) : 0.0f;
            for (std::int64_t i = 0; i < p.batch * p.heads * p.seq_q; ++i) {
                const bool over = i % p.seq_q == overflow_row;
                for (std::int64_t k = 0; k < d; ++k)
                    in.Q[i * d + k] = k != 0 ? 0.0f
                                      : by_scale ? (over ? -4.0f : 0.5f)
                                                 : (over ? -2e19f : 1e-19f * float(i % 7));
            }
            if (by_scale) p.scale = -1e38f;  // scale q.k = 4e38 on the overflow row
            INFO(c.backend << " " << to_string(c.dtype) << " mask=" << masked
                           << " N_kv=" << p.seq_kv << " kv_splits=" << p.kv_splits);
            const DeviceOutputs out = run_forward_on_stream(backend, p, in, c.dtype, mask);
            CHECK_FALSE(out.entry_waited);
            for (std::int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
                const std::int64_t over = bh * p.seq_q + overflow_row, empty = bh * p.seq_q + empty_row;
                CHECK(std::isnan(out.lse[over]));
                CHECK(out.lse[empty] == -std::numeric_limits<float>::infinity());
                for (std::int64_t k = 0; k < d; ++k) {
                    CHECK(std::isnan(out.O[over * d + k]));
                    CHECK(out.O[empty * d + k] == 0.0f);
                }
                for (std::int64_t r = 0; r < p.seq_q; ++r)  // every other row seen by a key: finite
                    if (r != overflow_row && p.row_has_visible_key(r))
                        CHECK(std::isfinite(out.lse[bh * p.seq_q + r]));
            }
        }
    }
}

TEST_CASE("cuda-tc's device entry writes a contiguous 16-bit O: decoding (split and not) and prefill") {
    const Backend& tc = find_backend("cuda-tc");
    REQUIRE(tc.device_o_dtype);
    struct TcCase {
        std::int64_t Nq, Nkv, dim, kv_splits;  // kv_splits 0: the library's choice
        bool causal;
    };
    // N_q = 1 and 3 with GQA take the decoding kernel, split (the default at N_kv = 1000) and
    // unsplit (S forced to 1): O comes from the combine and from the epilogue respectively.
    // 113 x 203 takes the prefill tile.
    const std::vector<TcCase> cases = {{1, 1000, 128, 0, false}, {3, 1000, 64, 0, true},
                                       {3, 1000, 128, 1, false}, {113, 203, 64, 0, true}};
    for (DType dtype : {DType::f16, DType::bf16})
        for (const TcCase& c : cases) {
            AttentionProblem p = test::make_problem(2, 8, 2, c.Nq, c.Nkv, c.dim, c.causal);
            p.kv_splits = c.kv_splits;
            const std::uint64_t seed = test::next_seed();
            INFO(to_string(dtype) << " " << test::describe(p) << " kv_splits=" << c.kv_splits
                                  << " seed=" << seed);
            const ProblemData in = random_problem_data(p, seed);
            // The host path: the same kernels (the same tile and S), float32 O.
            const test::Outputs host = test::run_poisoned(tc, p, in, dtype);

            Stream stream;
            Staged Q(as_bytes(in.Q, dtype, cuda::q_sign(p)));
            Staged K(as_bytes(in.K, dtype)), V(as_bytes(in.V, dtype));
            // O, then 64 guard elements: all 0xFFFF, which only O's own elements may change.
            const std::size_t n = static_cast<std::size_t>(p.q_elements());
            Staged O(bytes_of(std::vector<std::uint16_t>(n + 64, 0xFFFF)));
            for (Staged* x : {&Q, &K, &V, &O}) x->copy(stream.s);
            ForwardCall call(tc, p, dtype, Q.data(), K.data(), V.data(), O.device.data(),
                             stream.s);
            DeviceForward& a = call.a;
            a.o_dtype = dtype;
            tc.run_device(p, a);
            FA_CUDA_CHECK(cudaStreamSynchronize(stream.s));
            // O is the host path's float32 O rounded to nearest even, bit for bit.
            const std::vector<std::uint16_t> bits = download_bits(O);
            std::size_t wrong = 0, touched = 0;
            for (std::size_t k = 0; k < n; ++k) wrong += bits[k] != cuda::to_bits(host.O[k], dtype);
            for (std::size_t k = n; k < bits.size(); ++k) touched += bits[k] != 0xFFFF;
            CHECK(wrong == 0);
            CHECK(touched == 0);
            CHECK(max_difference(download(call.lse), host.lse) == 0.0);

            // An O dtype that is neither float32 nor the inputs', a misaligned 16-bit O, and a
            // strided O are refused before any work.
            DeviceForward bad = a;
            bad.o_dtype = dtype == DType::f16 ? DType::bf16 : DType::f16;
            CHECK_THROWS_AS(tc.run_device(p, bad), std::invalid_argument);
            bad = a;
            bad.O = static_cast<std::uint8_t*>(O.device.data()) + 2;
            CHECK_THROWS_AS(tc.run_device(p, bad), std::invalid_argument);
            bad = a;
            bad.o_layout = {p.seq_q * p.heads * p.dim, p.dim, p.heads * p.dim};
            CHECK_THROWS_AS(tc.run_device(p, bad), std::invalid_argument);
        }
}

TEST_CASE("cuda-tc: a decoding step reads the O that the step before it wrote, though their kernels overlap") {
    // Each decoding kernel may start while the stream's previous kernel ends, and the combine
    // lets the next kernel start as soon as it has its partials (cuda/host/dependent_launch.hpp):
    // the next kernel must still wait for every value before it reads one. Here step 2's Q is
    // step 1's O, which holds 0xFFFF (NaN) until step 1 writes it: a step 2 that read early
    // would differ from the host path, where step 2 runs on step 1's O rounded alike.
    const Backend& tc = find_backend("cuda-tc");
    REQUIRE(tc.device_o_dtype);
    for (DType dtype : {DType::f16, DType::bf16})
        for (std::int64_t kv_splits : {0, 1}) {  // split (the combine writes O) and unsplit
            AttentionProblem p = test::make_problem(2, 8, 2, 1, 1000, 128);
            p.kv_splits = kv_splits;
            REQUIRE(cuda::q_sign(p) == 1.0f);  // so that O's bits are Q's as the kernel reads it
            const std::uint64_t seed = test::next_seed();
            INFO(to_string(dtype) << " " << test::describe(p) << " kv_splits=" << kv_splits
                                  << " seed=" << seed);
            const ProblemData in = random_problem_data(p, seed);
            const std::size_t n = static_cast<std::size_t>(p.q_elements());

            Stream stream;
            Staged Q(as_bytes(in.Q, dtype)), K(as_bytes(in.K, dtype)), V(as_bytes(in.V, dtype));
            Staged O1(bytes_of(std::vector<std::uint16_t>(n, 0xFFFF)));
            Staged O2(bytes_of(std::vector<std::uint16_t>(n, 0xFFFF)));
            for (Staged* x : {&Q, &K, &V, &O1, &O2}) x->copy(stream.s);
            ForwardCall step1(tc, p, dtype, Q.data(), K.data(), V.data(), O1.device.data(),
                              stream.s);
            ForwardCall step2(tc, p, dtype, O1.data(), K.data(), V.data(), O2.device.data(),
                              stream.s);
            step1.a.o_dtype = step2.a.o_dtype = dtype;
            // Both steps queued behind a held stream, so that their kernels run back to back
            // (called one after the other, step 1 would be done before step 2 is launched).
            Hold hold;
            hold.queue(stream.s);
            tc.run_device(p, step1.a);
            tc.run_device(p, step2.a);
            hold.released = true;
            FA_CUDA_CHECK(cudaStreamSynchronize(stream.s));
            REQUIRE_FALSE(hold.gave_up.load());

            const test::Outputs host1 = test::run_poisoned(tc, p, in, dtype);
            ProblemData in2 = in;
            for (std::size_t k = 0; k < n; ++k)
                in2.Q[k] = cuda::from_bits(cuda::to_bits(host1.O[k], dtype), dtype);
            const test::Outputs host2 = test::run_poisoned(tc, p, in2, dtype);
            const std::vector<std::uint16_t> bits = download_bits(O2);
            std::size_t wrong = 0;
            for (std::size_t k = 0; k < n; ++k)
                wrong += bits[k] != cuda::to_bits(host2.O[k], dtype);
            CHECK(wrong == 0);
            CHECK(max_difference(download(step2.lse), host2.lse) == 0.0);
        }
}
