// examples/python/module.cpp — the C++ half of `import flashattn` (pybind11): the backend registry
// reached from Python. The Python half (src/flashattn/__init__.py) checks every argument, names the bad
// one in its error, reshapes (N, d) to (1, 1, N, d) and handles PyTorch tensors; this file takes
// C-contiguous float32 arrays of shape (B, H, N, d) and runs one backend on them, or merges
// partial results with the library's LSE merge (merge_partials).
//
// This module is importable on its own (flashattn._flashattn), so it trusts nothing it is given:
// every array is checked against the problem (a backend reads exactly the elements the problem
// says, so a short V or a K of another head dimension would be read past its end), the problem
// against validate() (common/problem.hpp), and a block mask against its (Tr, Tc) tile grid, before
// any backend runs. The device entries take addresses, whose sizes cannot be checked here: the
// Python layer checks the tensors' shapes, calls validate_problem before any copy or CUDA work,
// and allocates the outputs itself.
//
// Errors: the library's std::invalid_argument becomes ValueError, std::runtime_error RuntimeError
// (pybind11's standard translation); an argument of the wrong type is pybind11's TypeError. The GIL
// is released while a backend computes, so other Python threads run meanwhile; the arrays stay
// alive because the call holds them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/online_softmax.hpp"
#include "common/registry.hpp"
#include "common/score_range.hpp"
#include "device_problem.hpp"

namespace py = pybind11;

namespace flashattn::python {
namespace {

using FloatArray = py::array_t<float, py::array::c_style>;
using MaskArray = py::array_t<std::uint8_t, py::array::c_style>;

std::vector<std::int64_t> shape_of(const py::array& a) {
    return std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim());
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i)
        s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");  // Python's spelling of a 1-tuple
}

// Throws std::invalid_argument unless `a` has exactly `expected` as its shape.
void require_shape(const char* name, const py::array& a,
                   const std::vector<std::int64_t>& expected) {
    if (shape_of(a) != expected)
        throw std::invalid_argument(std::string(name) + " has shape " + shape_string(shape_of(a)) +
                                    ": must be " + shape_string(expected));
}

// Runs `work` with the GIL released (the library's threads and kernels need no Python), and
// rethrows what it threw only once the GIL is held again: an exception is turned into a Python
// one by pybind11, which needs the GIL, and leaving the released region by an exception crashed
// the interpreter on Ubuntu 24.04's Python 3.12 (a refused problem, flashattn.attention on NumPy).
template <class Work>
void without_gil(Work work) {
    std::exception_ptr failure;
    {
        py::gil_scoped_release release;
        try {
            work();
        } catch (...) {
            failure = std::current_exception();
        }
    }
    if (failure) std::rethrow_exception(failure);
}

// The problem of (B, H, N_q, d) queries and (B, H_kv, N_kv, d) keys; k must match q in B and d.
AttentionProblem problem_of(const FloatArray& q, const FloatArray& k, bool causal, double scale) {
    if (q.ndim() != 4)
        throw std::invalid_argument("q has shape " + shape_string(shape_of(q)) +
                                    ": must be 4-dimensional (B, H, N_q, d) here");
    if (k.ndim() != 4)
        throw std::invalid_argument("k has shape " + shape_string(shape_of(k)) +
                                    ": must be 4-dimensional (B, H_kv, N_kv, d) here");
    AttentionProblem p;
    p.batch = q.shape(0), p.heads = q.shape(1), p.seq_q = q.shape(2), p.dim = q.shape(3);
    p.heads_kv = k.shape(1), p.seq_kv = k.shape(2);
    p.causal = causal;
    p.scale = checked_scale(scale);
    require_shape("k", k, {p.batch, p.heads_kv, p.seq_kv, p.dim});
    return p;
}

// Adds the block mask of Algorithm 5 (its own block size mask_block_q x mask_block_kv), then
// validates the problem (std::invalid_argument, so ValueError) and the mask's size: a backend
// reads entry (i / Br, j / Bc) of a (Tr, Tc) array for every visible pair (i, j).
AttentionProblem with_mask(AttentionProblem p, const std::optional<MaskArray>& mask,
                           std::int64_t mask_block_q, std::int64_t mask_block_kv) {
    if (mask) p.block_mask = {mask->data(), mask_block_q, mask_block_kv};
    validate(p);
    if (mask)
        require_shape("block_mask", *mask,
                      {ceil_div(p.seq_q, mask_block_q), ceil_div(p.seq_kv, mask_block_kv)});
    return p;
}

std::vector<py::ssize_t> array_shape(const FloatArray& a) {
    return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

py::tuple attention(const FloatArray& q, const FloatArray& k, const FloatArray& v, bool causal,
                    double scale, const std::string& backend_name,
                    const std::optional<MaskArray>& mask, std::int64_t mask_block_q,
                    std::int64_t mask_block_kv, const std::string& dtype_name) {
    const AttentionProblem p =
        with_mask(problem_of(q, k, causal, scale), mask, mask_block_q, mask_block_kv);
    require_shape("v", v, shape_of(k));
    const Backend& backend = find_backend(backend_name);
    const DType dtype = parse_dtype(dtype_name);
    FloatArray O(array_shape(q));
    FloatArray lse(std::vector<py::ssize_t>{p.batch, p.heads, p.seq_q});
    float* O_data = O.mutable_data();
    float* lse_data = lse.mutable_data();
    without_gil([&] {
        auto prepared = backend.prepare(p, q.data(), k.data(), v.data(), dtype);
        prepared->execute();
        prepared->fetch(O_data, lse_data);
    });
    return py::make_tuple(O, lse);
}

py::tuple attention_backward(const FloatArray& q, const FloatArray& k, const FloatArray& v,
                             const FloatArray& o, const FloatArray& lse, const FloatArray& dO,
                             bool causal, double scale, const std::string& backend_name,
                             const std::optional<MaskArray>& mask, std::int64_t mask_block_q,
                             std::int64_t mask_block_kv, const std::string& dtype_name) {
    const AttentionProblem p =
        with_mask(problem_of(q, k, causal, scale), mask, mask_block_q, mask_block_kv);
    require_shape("v", v, shape_of(k));
    require_shape("o", o, shape_of(q));
    require_shape("do", dO, shape_of(q));
    require_shape("lse", lse, {p.batch, p.heads, p.seq_q});
    const Backend& backend = find_backend(backend_name);
    require_backward(backend);
    const DType dtype = parse_dtype(dtype_name);
    FloatArray dQ(array_shape(q)), dK(array_shape(k)), dV(array_shape(v));
    const BackwardInputs in{q.data(), k.data(), v.data(), o.data(), lse.data(), dO.data()};
    float *dQ_data = dQ.mutable_data(), *dK_data = dK.mutable_data(), *dV_data = dV.mutable_data();
    without_gil([&] {
        auto prepared = backend.prepare_backward(p, in, dtype);
        prepared->execute();
        prepared->fetch(dQ_data, dK_data, dV_data);
    });
    return py::make_tuple(dQ, dK, dV);
}

// The LSE merge of S partial results over disjoint key sets (split-KV, ring attention): O_parts
// is (S, R, d), lse_parts (S, R), one row r of part s being (O_s[r], LSE_s[r]); returns the
// merged O (R, d) and LSE (R,). Each row is folded by merge_partial_row (common/online_softmax.hpp),
// the one place the rule is written, in the order s = 0 .. S-1.
py::tuple merge_partials(const FloatArray& O_parts, const FloatArray& lse_parts) {
    if (O_parts.ndim() != 3)
        throw std::invalid_argument("O_parts has shape " + shape_string(shape_of(O_parts)) +
                                    ": must be 3-dimensional (S, R, d)");
    const std::int64_t S = O_parts.shape(0), R = O_parts.shape(1), d = O_parts.shape(2);
    if (S < 1 || S > std::numeric_limits<int>::max())
        throw std::invalid_argument("O_parts has S = " + std::to_string(S) +
                                    " parts: must be in [1, 2**31 - 1]");
    require_shape("lse_parts", lse_parts, {S, R});
    FloatArray O(std::vector<py::ssize_t>{R, d});
    FloatArray lse(std::vector<py::ssize_t>{R});
    const float* O_in = O_parts.data();
    const float* lse_in = lse_parts.data();
    float* O_out = O.mutable_data();
    float* lse_out = lse.mutable_data();
    without_gil([&] {
        for (std::int64_t r = 0; r < R; ++r)
            lse_out[r] = merge_partial_row(static_cast<int>(S), lse_in + r, R, O_in + r * d, R * d,
                                           d, 0, 1, O_out + r * d);
    });
    return py::make_tuple(O, lse);
}

// The device entries (Backend::run_device): tensors already on the GPU, passed as addresses
// (torch.Tensor.data_ptr()), with the caller's CUDA stream. Shapes as (B, H, H_kv, N_q, N_kv, d)
// (Shape, device_problem: device_problem.hpp).

// The array at `address`; 0 (a null pointer) is refused naming the array. Nothing else about a
// device address can be checked from here.
template <class T>
T* pointer(std::uintptr_t address, const char* name) {
    require_array(reinterpret_cast<const void*>(address), name);
    return reinterpret_cast<T*>(address);
}

// The problem a call describes, validated with its block mask: the Python layer calls this before
// it copies an array or allocates anything on the GPU, so a bad call fails before any such work.
void validate_problem(const Shape& shape, bool causal, double scale,
                          const std::optional<MaskArray>& mask, std::int64_t mask_block_q,
                          std::int64_t mask_block_kv) {
    with_mask(device_problem(shape, causal, scale), mask, mask_block_q, mask_block_kv);
}

// The workspace a device entry needs for this problem (Backend::device_workspace_bytes, or the
// backward's), in bytes: the caller allocates it, 256-byte aligned, on the stream it then passes.
std::size_t device_workspace_bytes(const std::string& backend_name, const Shape& shape,
                                   bool causal, double scale, const std::optional<MaskArray>& mask,
                                   std::int64_t mask_block_q, std::int64_t mask_block_kv,
                                   const std::string& dtype_name, bool backward) {
    const AttentionProblem p =
        with_mask(device_problem(shape, causal, scale), mask, mask_block_q, mask_block_kv);
    const DType dtype = parse_dtype(dtype_name);
    const Backend& b = device_backend(backend_name, backward);
    const auto& bytes = backward ? b.device_backward_workspace_bytes : b.device_workspace_bytes;
    return bytes ? bytes(p, dtype) : 0;
}

// The problem of a device entry: with `mask` (host), validated against it as with_mask does;
// with only the device copy at `block_mask` (a CUDA tensor the caller checked by shape and dtype:
// its values cannot be read without waiting), the problem's mask is that device array.
AttentionProblem device_entry_problem(const Shape& shape, bool causal, double scale,
                                      const std::optional<MaskArray>& mask,
                                      std::int64_t mask_block_q, std::int64_t mask_block_kv,
                                      std::uintptr_t block_mask) {
    AttentionProblem p = device_problem(shape, causal, scale);
    if (mask || block_mask == 0) return with_mask(p, mask, mask_block_q, mask_block_kv);
    p.block_mask = {reinterpret_cast<const std::uint8_t*>(block_mask), mask_block_q, mask_block_kv};
    validate(p);
    return p;
}

// An array's element strides (batch, head, row) as the Python package passes them; (0, 0, 0) is
// the contiguous layout.
using Strides = std::array<std::int64_t, 3>;
ArrayLayout layout_of(const Strides& s) { return {s[0], s[1], s[2]}; }

// Q, K, V (and dO) hold values of `dtype_name` ("f32", "f16", "bf16"; for f16/bf16, Q times the
// sign of the scale, as cuda-tc expects); LSE is float32, O and the gradients float32 unless
// `o_dtype_name` / `grad_dtype_name` say the inputs' dtype. `layouts` give the arrays' strides:
// Q, K, V, O for the forward; Q, K, V, O, dO, dQ, dK, dV for the backward (a backend without
// Backend::device_layouts takes only contiguous arrays, and float32 unless its forward has
// Backend::device_o_dtype). The call queues
// the work on `stream` and returns (common/backend.hpp, DeviceForward): `workspace` holds
// `workspace_bytes` bytes of device memory (device_workspace_bytes above; 0 where it is 0), and
// `block_mask` the device copy of the mask (0 without one); both stay alive until the stream has
// run the work. A host `mask`, when given, is what is validated (device_entry_problem).
void attention_device(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
                      std::uintptr_t lse, const Shape& shape, bool causal, double scale,
                      const std::string& backend_name, const std::optional<MaskArray>& mask,
                      std::int64_t mask_block_q, std::int64_t mask_block_kv,
                      std::uintptr_t stream, const std::string& dtype_name,
                      std::uintptr_t workspace, std::size_t workspace_bytes,
                      std::uintptr_t block_mask, const std::array<Strides, 4>& layouts,
                      const std::string& o_dtype_name) {
    const AttentionProblem p = device_entry_problem(shape, causal, scale, mask, mask_block_q,
                                                    mask_block_kv, block_mask);
    DeviceForward a;
    a.q_layout = layout_of(layouts[0]), a.k_layout = layout_of(layouts[1]);
    a.v_layout = layout_of(layouts[2]), a.o_layout = layout_of(layouts[3]);
    a.o_dtype = parse_dtype(o_dtype_name);
    a.Q = pointer<const void>(q, "q"), a.K = pointer<const void>(k, "k");
    a.V = pointer<const void>(v, "v");
    a.O = pointer<float>(o, "o"), a.lse = pointer<float>(lse, "lse");
    a.stream = reinterpret_cast<void*>(stream);  // 0 is the default stream
    a.dtype = parse_dtype(dtype_name);
    a.workspace = reinterpret_cast<void*>(workspace), a.workspace_bytes = workspace_bytes;
    a.block_mask = reinterpret_cast<const std::uint8_t*>(block_mask);
    const Backend& backend = device_backend(backend_name, false);
    without_gil([&] { backend.run_device(p, a); });
}

void attention_backward_device(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v,
                               std::uintptr_t o, std::uintptr_t lse, std::uintptr_t dO,
                               std::uintptr_t dQ, std::uintptr_t dK, std::uintptr_t dV,
                               const Shape& shape, bool causal, double scale,
                               const std::string& backend_name,
                               const std::optional<MaskArray>& mask, std::int64_t mask_block_q,
                               std::int64_t mask_block_kv, std::uintptr_t stream,
                               const std::string& dtype_name, std::uintptr_t workspace,
                               std::size_t workspace_bytes, std::uintptr_t block_mask,
                               const std::array<Strides, 8>& layouts,
                               const std::string& o_dtype_name,
                               const std::string& grad_dtype_name) {
    const AttentionProblem p = device_entry_problem(shape, causal, scale, mask, mask_block_q,
                                                    mask_block_kv, block_mask);
    DeviceBackward a;
    a.Q = pointer<const void>(q, "q"), a.K = pointer<const void>(k, "k");
    a.V = pointer<const void>(v, "v"), a.dO = pointer<const void>(dO, "do");
    a.O = pointer<const void>(o, "o"), a.lse = pointer<const float>(lse, "lse");
    a.dQ = pointer<void>(dQ, "dq"), a.dK = pointer<void>(dK, "dk");
    a.dV = pointer<void>(dV, "dv");
    a.q_layout = layout_of(layouts[0]), a.k_layout = layout_of(layouts[1]);
    a.v_layout = layout_of(layouts[2]), a.o_layout = layout_of(layouts[3]);
    a.do_layout = layout_of(layouts[4]), a.dq_layout = layout_of(layouts[5]);
    a.dk_layout = layout_of(layouts[6]), a.dv_layout = layout_of(layouts[7]);
    a.o_dtype = parse_dtype(o_dtype_name), a.grad_dtype = parse_dtype(grad_dtype_name);
    a.stream = reinterpret_cast<void*>(stream);  // 0 is the default stream
    a.dtype = parse_dtype(dtype_name);
    a.workspace = reinterpret_cast<void*>(workspace), a.workspace_bytes = workspace_bytes;
    a.block_mask = reinterpret_cast<const std::uint8_t*>(block_mask);
    const Backend& backend = device_backend(backend_name, true);
    without_gil([&] { backend.run_backward_device(p, a); });
}

// flashattn.merge_partials on CUDA tensors: (S, rows, d) and (S, rows) float32 partial results
// at o_parts / lse_parts merged into (rows, d) and (rows) at o / lse, queued on `stream`.
void merge_partials_device(std::uintptr_t o_parts, std::uintptr_t l_parts, std::int64_t S,
                           std::int64_t rows, std::int64_t d, std::uintptr_t o, std::uintptr_t l,
                           std::uintptr_t stream) {
    if (rows < 0) throw std::invalid_argument("rows = " + std::to_string(rows) + ": must be >= 0");
    const float* O_parts = pointer<const float>(o_parts, "outputs");
    const float* lse_parts = pointer<const float>(l_parts, "lses");
    float* O = pointer<float>(o, "O");
    float* L = pointer<float>(l, "LSE");
    without_gil([&] {
        flashattn::merge_partials_device(O_parts, lse_parts, S, rows, d, O, L,
                                         reinterpret_cast<void*>(stream));
    });
}

}  // namespace
}  // namespace flashattn::python

PYBIND11_MODULE(_flashattn, m) {
    using namespace flashattn;
    m.doc() = "C++ side of the flashattn package; use `import flashattn` instead.";
    m.def("backends", [] {
        std::vector<py::dict> list;
        for (const Backend& b : available_backends()) {
            py::dict d;
            d["name"] = b.name;
            d["device"] = b.device;
            d["summary"] = b.summary;
            std::vector<std::string> dtypes;
            for (DType t : b.dtypes) dtypes.push_back(to_string(t));
            d["dtypes"] = dtypes;
            d["backward"] = b.has_backward();
            d["device_arrays"] = static_cast<bool>(b.run_device);
            d["device_layouts"] = b.device_layouts;
            d["device_o_dtype"] = b.device_o_dtype;
            list.push_back(d);
        }
        return list;
    });
    m.def("attention", &python::attention);
    m.def("attention_backward", &python::attention_backward);
    m.def("merge_partials", &python::merge_partials);
    py::class_<python::Shape>(m, "Shape")
        .def(py::init<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                      std::int64_t>());
    m.def("validate", &python::validate_problem);
    // The bound on |scores| the library computes within (common/score_range.hpp), for the
    // package's check of CUDA tensors, which the library cannot read.
    m.attr("score_limit") = kScoreLimit;
    m.def("device_workspace_bytes", &python::device_workspace_bytes);
    m.def("attention_device", &python::attention_device);
    m.def("attention_backward_device", &python::attention_backward_device);
    m.def("merge_partials_device", &python::merge_partials_device);
}
