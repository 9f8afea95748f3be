// common/registry.cpp — the backends of this build; see registry.hpp. The one translation unit of
// common/: it joins the forms' lists, so it is built into flashattn::backends, above cpu and cuda.
#include "common/registry.hpp"

#include "common/score_range.hpp"

#include <fstream>
#include <stdexcept>

namespace flashattn {
namespace {

// Every prepare first checks what the interface promises for all backends alike: a backend that
// chooses its own tiles refuses explicit ones (require_tile_choice), and no backend is given
// scores float32 cannot hold (require_representable_scores: an overflowed row would read as
// fully masked). An invalid problem is reported as such first (validate), so that its message
// names the bad field. Device-resident inputs (run_device) cannot be read here without waiting
// for them: there the kernels mark a row whose scores overflowed NaN instead of reading as masked
// (scores_overflowed, common/online_softmax.hpp).
Backend with_tile_check(Backend b) {
    Backend checked;  // only what the check reads
    checked.name = b.name, checked.tile_sizes = b.tile_sizes;
    b.prepare = [checked, inner = b.prepare](const AttentionProblem& p, const float* Q,
                                             const float* K, const float* V, DType dtype) {
        validate(p);
        require_tile_choice(checked, p);
        require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
        require_representable_scores(p, Q, K);
        return inner(p, Q, K, V, dtype);
    };
    if (b.has_backward())
        b.prepare_backward = [checked, inner = b.prepare_backward](
                                 const AttentionProblem& p, const BackwardInputs& in, DType dtype) {
            validate(p);
            require_tile_choice(checked, p);
            require_backward_inputs(in);
            require_representable_scores(p, in.Q, in.K);
            return inner(p, in, dtype);
        };
    if (b.run_device)
        b.run_device = [checked, inner = b.run_device](const AttentionProblem& p,
                                                       const DeviceForward& a) {
            validate(p);
            require_tile_choice(checked, p);
            inner(p, a);
        };
    if (b.run_backward_device)
        b.run_backward_device = [checked, inner = b.run_backward_device](
                                    const AttentionProblem& p, const DeviceBackward& a) {
            validate(p);
            require_tile_choice(checked, p);
            inner(p, a);
        };
    return b;
}

std::vector<Backend> make_backends() {
    std::vector<Backend> list;
    for (Backend& b : cpu_backends()) list.push_back(with_tile_check(std::move(b)));
#ifdef FLASHATTN_WITH_CUDA
    for (Backend& b : cuda_backends()) list.push_back(with_tile_check(std::move(b)));
#endif
    return list;
}

}  // namespace

const std::vector<Backend>& available_backends() {
    static const std::vector<Backend> backends = make_backends();
    return backends;
}

const Backend& find_backend(const std::string& name) {
    std::string names;
    for (const Backend& b : available_backends()) {
        if (b.name == name) return b;
        names += (names.empty() ? "" : ", ") + b.name;
    }
    throw std::invalid_argument("backend = " + name + ": not available in this build (available: " +
                                names + ")");
}

std::string device_name(const std::string& device) {
#ifdef FLASHATTN_WITH_CUDA
    if (device == "cuda") return cuda_device_name();
#endif
    if (device != "cpu") return device;
    std::ifstream cpuinfo("/proc/cpuinfo");
    const std::string key = "model name";
    for (std::string line; std::getline(cpuinfo, line);)
        if (line.compare(0, key.size(), key) == 0 && line.find(':') != std::string::npos) {
            const std::size_t start = line.find_first_not_of(" \t", line.find(':') + 1);
            if (start != std::string::npos) return line.substr(start);
        }
    return device;
}

void merge_partials_device(const float* O_parts, const float* lse_parts, std::int64_t S,
                           std::int64_t rows, std::int64_t d, float* O, float* lse, void* stream) {
    if (S < 1) throw std::invalid_argument("S = " + std::to_string(S) + ": no partial results");
#ifdef FLASHATTN_WITH_CUDA
    cuda_merge_partials(O_parts, lse_parts, S, rows, d, O, lse, stream);
#else
    (void)O_parts, (void)lse_parts, (void)rows, (void)d, (void)O, (void)lse, (void)stream;
    throw std::runtime_error("merge_partials on the GPU: this build has no CUDA");
#endif
}

}  // namespace flashattn
