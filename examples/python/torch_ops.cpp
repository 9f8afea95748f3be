// examples/python/torch_ops.cpp — the CUDA implementations of the operators
// flashattn::attention_forward and flashattn::attention_backward, in C++, registered with
// PyTorch's dispatcher (module flashattn._torch_ops, built where PyTorch's C++ headers and CUDA
// are found).
//
// Why C++: a compiled model calls each operator through the dispatcher, and a Python
// implementation costs that call the dispatcher's way back into Python and the Python work around
// the launch (docs/python.md, "Where a call's host time goes"). Here a call whose signature has
// been planned before runs from the dispatcher to the kernel launch without Python: it allocates
// the outputs and the workspace from PyTorch's caching allocator, takes PyTorch's current stream,
// and calls the backend's device entry, as the Python implementation does.
//
// What stays in Python (src/flashattn/__init__.py), written once there:
// - every check of a call, and the choice of the backend: a signature not seen before (the
//   shapes, dtypes and devices of the tensors, causal, scale, backend, direction, and the two
//   settings FLASHATTN_VARIANT and FLASHATTN_DETERMINISTIC) is planned by `_device_plan`, which
//   raises for a bad call (nothing is kept then) or returns the backend, dtype and workspace size;
// - every call that is not the fast path below: a block mask, a negative scale (folded into a
//   copy of Q), and tensors that are not 4-D. Those calls run the Python implementation, called
//   from here.
// The fast path is the Python implementation's branches for the other calls: for a backend with
// strided layouts (cuda-fa3, cuda-fa2), q, k, v (and O, dO) read where they lie when TMA can read
// them (cuda-fa2's copies read any such view too), O and the gradients written in q's dtype in
// their inputs' order; for the other (cuda-tc), contiguous arrays (copies of those that are not)
// and the outputs the kernels write, cast or copied into results in their inputs' order. Two small layout rules are therefore written in
// both languages, each naming its twin: output_like (`_output_like`) and readable_in_place
// (`_readable_in_place`); torch.library.opcheck's fake-tensor test compares the strides of the
// outputs with the fake implementation's, which uses the Python rule.
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "device_problem.hpp"

namespace py = pybind11;

namespace flashattn::python {
namespace {

// What a signature's plan says: run the fast path below with this backend, dtype and workspace,
// or hand the call to the Python implementation (fast = false). layouts: the backend reads strided
// tensors and writes q's dtype (cuda-fa3, and cuda-fa2 in float32); else it reads contiguous
// arrays and writes float32, or with o_dtype its forward writes O in q's dtype (cuda-tc).
struct Plan {
    bool fast = false;
    const Backend* backend = nullptr;
    DType dtype = DType::f32;
    std::size_t workspace_bytes = 0;
    bool layouts = false, o_dtype = false;
};

// A call's signature: everything `_signature` (Python) keys a plan on.
struct Signature {
    std::vector<std::int64_t> numbers;  // direction, causal, scale, and each tensor's metadata
    std::optional<std::string> backend, variant, deterministic;
    bool operator==(const Signature& o) const {
        return numbers == o.numbers && backend == o.backend && variant == o.variant &&
               deterministic == o.deterministic;
    }
};

std::optional<std::string> setting(const char* name) {
    const char* value = std::getenv(name);  // os.environ's writes reach the process environment
    return value ? std::optional<std::string>(value) : std::nullopt;
}

Signature signature_of(bool backward, const std::vector<at::Tensor>& xs, bool causal,
                       const std::optional<double>& scale,
                       const std::optional<std::string>& backend) {
    Signature s;
    s.numbers.reserve(4 + xs.size() * 8);
    s.numbers.push_back(backward);
    s.numbers.push_back(causal);
    s.numbers.push_back(scale.has_value());
    std::int64_t bits = 0;
    if (scale) std::memcpy(&bits, &*scale, sizeof bits);
    s.numbers.push_back(bits);
    for (const at::Tensor& x : xs) {
        s.numbers.push_back(x.dim());
        for (std::int64_t n : x.sizes()) s.numbers.push_back(n);
        s.numbers.push_back(static_cast<std::int64_t>(x.scalar_type()));
        s.numbers.push_back(static_cast<std::int64_t>(x.device().type()));
        s.numbers.push_back(x.device().index());
    }
    s.backend = backend;
    s.variant = setting("FLASHATTN_VARIANT");
    s.deterministic = setting("FLASHATTN_DETERMINISTIC");
    return s;
}

// The Python functions this file calls, set once by register_operators (never freed: they live
// as long as the process's registrations do).
struct PythonSide {
    py::object plan, forward, backward;
};
PythonSide* python_side = nullptr;

// The plans of the signatures seen, as a short list (a model has a few); emptied past 256, as
// the Python side's dict is. The mutex is never held while the GIL is being taken: a thread that
// holds the GIL may be waiting for it.
std::mutex plans_mutex;
std::vector<std::pair<Signature, Plan>> plans;

Plan plan_for(bool backward, const std::vector<at::Tensor>& xs, bool causal,
              const std::optional<double>& scale, const std::optional<std::string>& backend) {
    Signature s = signature_of(backward, xs, causal, scale, backend);
    {
        std::lock_guard<std::mutex> lock(plans_mutex);
        for (const auto& [known, plan] : plans)
            if (known == s) return plan;
    }
    Plan plan;
    {
        py::gil_scoped_acquire gil;
        py::tuple tensors(xs.size());
        for (std::size_t i = 0; i < xs.size(); ++i) tensors[i] = py::cast(xs[i]);
        // Raises for a bad call (py::error_already_set): nothing is kept.
        py::object result = python_side->plan(backward, tensors, causal,
                                              scale ? py::cast(*scale) : py::none(),
                                              backend ? py::cast(*backend) : py::none());
        if (!result.is_none()) {
            auto [name, dtype, bytes, layouts, o_dtype] =
                result.cast<std::tuple<std::string, std::string, std::size_t, bool, bool>>();
            plan.fast = true;
            plan.backend = &device_backend(name, backward);
            plan.dtype = parse_dtype(dtype);
            plan.workspace_bytes = bytes;
            plan.layouts = layouts, plan.o_dtype = o_dtype;
        }
    }
    std::lock_guard<std::mutex> lock(plans_mutex);
    if (plans.size() >= 256) plans.clear();
    plans.emplace_back(std::move(s), plan);
    return plan;
}

// --- the fast path -------------------------------------------------------------------------
//
// A backend with layouts reads q, k, v (and O, dO) where TMA can (cuda-fa3's rule, which
// cuda-fa2's copies also take) and writes O and the gradients in their inputs' order and q's
// dtype. One without reads contiguous arrays and writes
// contiguous float32 results (or O in q's dtype with o_dtype; it reads a float32 O): the fast
// path copies and casts as `_cuda_forward` and `_cuda_backward` do, and writes into the results
// themselves where they are what the kernels write.

// Calls the fast path ran, forward and backward (for the tests: which calls took it).
std::atomic<std::uint64_t> fast_forwards{0}, fast_backwards{0};

// A result for the input x: x's shape and dtype, its rows in the order of x's. Where x's heads
// lie closer together than its rows (a view of one (B, N, H d) projection), (B, N, H, d) memory
// viewed as (B, H, N, d). The twin of `_output_like` (Python), which the fake implementation uses.
at::Tensor output_like(const at::Tensor& x) {
    if (x.stride(1) < x.stride(2)) {
        return at::empty({x.size(0), x.size(2), x.size(1), x.size(3)}, x.options())
            .transpose(1, 2);
    }
    return at::empty(x.sizes(), x.options());
}

ArrayLayout strides_of(const at::Tensor& x) { return {x.stride(0), x.stride(1), x.stride(2)}; }

// x where TMA (cuda-fa3), and so cuda-fa2's copies, can read it where it lies (d contiguous, a
// 16-byte aligned address, every other stride a positive multiple of 8 elements, the row stride
// below 2^31 elements: cuda-fa2's copies hold it in an int, require_input_layout), with its
// strides; else a contiguous copy, with the contiguous layout. The twin of `_readable_in_place`
// (Python).
std::pair<at::Tensor, ArrayLayout> readable_in_place(const at::Tensor& x) {
    const auto st = x.strides();
    const bool readable = st[3] == 1 && reinterpret_cast<std::uintptr_t>(x.data_ptr()) % 16 == 0;
    if (readable && st[0] > 0 && st[1] > 0 && st[2] > 0 && st[0] % 8 == 0 && st[1] % 8 == 0 &&
        st[2] % 8 == 0 && st[2] < (std::int64_t{1} << 31))
        return {x, strides_of(x)};
    return {x.contiguous(), ArrayLayout{}};
}

// An input as the plan's backend reads it: where it lies (layouts), else contiguous (x itself
// where it is, else a copy, as `_device_array` makes).
std::pair<at::Tensor, ArrayLayout> in_place(const Plan& plan, const at::Tensor& x) {
    return plan.layouts ? readable_in_place(x) : std::make_pair(x.contiguous(), ArrayLayout{});
}

// The library's problem of q (B, H, N_q, d) and k (B, H_kv, N_kv, d), validated.
AttentionProblem problem_of(const at::Tensor& q, const at::Tensor& k, bool causal,
                            const std::optional<double>& scale) {
    const Shape shape{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
    AttentionProblem p = device_problem(shape, causal, scale ? *scale : std::nan(""));
    validate(p);
    return p;
}

at::Tensor workspace(const Plan& plan, const at::Tensor& q) {
    if (plan.workspace_bytes == 0) return at::Tensor();
    return at::empty({static_cast<std::int64_t>(plan.workspace_bytes)},
                     q.options().dtype(at::kByte));
}

void* current_stream(const at::Tensor& q) {
    return c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
}

// The forward of a planned call: (O, LSE), or nothing where the plan hands it to Python. `read`,
// where given, receives the arrays the kernels read: q, k, v themselves, or the copies made of
// them.
std::optional<std::pair<at::Tensor, at::Tensor>> fast_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
    const std::optional<double>& scale, const std::optional<std::string>& backend,
    std::array<at::Tensor, 3>* read = nullptr) {
    const Plan plan = plan_for(false, {q, k, v}, causal, scale, backend);
    if (!plan.fast) return std::nullopt;
    const AttentionProblem p = problem_of(q, k, causal, scale);
    c10::DeviceGuard guard(q.device());
    at::Tensor O = output_like(q);
    at::Tensor L = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    const auto [Q, q_at] = in_place(plan, q);
    const auto [K, k_at] = in_place(plan, k);
    const auto [V, v_at] = in_place(plan, v);
    // O as the kernels write it: in place (layouts), else contiguous, in q's dtype where they
    // write that (float32, or plan.o_dtype), else float32, cast into O afterwards.
    const bool o_direct = plan.layouts || (O.is_contiguous() &&
                                           (plan.dtype == DType::f32 || plan.o_dtype));
    const at::Tensor out = o_direct ? O : at::empty(q.sizes(), q.options().dtype(at::kFloat));
    const at::Tensor ws = workspace(plan, q);
    DeviceForward a;
    a.Q = Q.data_ptr(), a.K = K.data_ptr(), a.V = V.data_ptr();
    a.O = out.data_ptr(), a.lse = L.data_ptr<float>();
    a.q_layout = q_at, a.k_layout = k_at, a.v_layout = v_at;
    a.o_layout = plan.layouts ? strides_of(O) : ArrayLayout{};
    a.dtype = plan.dtype;
    a.o_dtype = o_direct ? plan.dtype : DType::f32;
    a.workspace = ws.defined() ? ws.data_ptr() : nullptr, a.workspace_bytes = plan.workspace_bytes;
    a.stream = current_stream(q);
    plan.backend->run_device(p, a);
    if (!o_direct) O.copy_(out);  // the cast to q's dtype, in O's layout
    if (read) *read = {Q, K, V};
    ++fast_forwards;
    return std::make_pair(O, L);
}

// The backward of a planned call: (dQ, dK, dV), or nothing where the plan hands it to Python.
std::optional<std::array<at::Tensor, 3>> fast_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
    const at::Tensor& lse, const at::Tensor& dO, bool causal, const std::optional<double>& scale,
    const std::optional<std::string>& backend) {
    const Plan plan = plan_for(true, {q, k, v, o, lse, dO}, causal, scale, backend);
    if (!plan.fast) return std::nullopt;
    const AttentionProblem p = problem_of(q, k, causal, scale);
    c10::DeviceGuard guard(q.device());
    std::array<at::Tensor, 3> grads{output_like(q), output_like(k), output_like(v)};
    const at::Tensor L = lse.is_contiguous() && lse.scalar_type() == at::kFloat
                             ? lse
                             : lse.to(at::kFloat).contiguous();
    const auto [Q, q_at] = in_place(plan, q);
    const auto [K, k_at] = in_place(plan, k);
    const auto [V, v_at] = in_place(plan, v);
    const auto [dOr, do_at] = in_place(plan, dO);
    // O is read value by value (the D pass): any strides with d contiguous (layouts); the
    // others read it contiguous and float32.
    const bool o_in_place = plan.layouts && o.stride(3) == 1;
    const at::Tensor O = o_in_place       ? o
                         : plan.layouts   ? o.contiguous()
                                          : o.to(at::kFloat).contiguous();
    // The gradients as the kernels write them: in place (layouts), else contiguous float32,
    // the results themselves where those are that, else cast into them afterwards.
    std::array<at::Tensor, 3> sums = grads;
    if (!plan.layouts)
        for (at::Tensor& g : sums)
            if (g.scalar_type() != at::kFloat || !g.is_contiguous())
                g = at::empty(g.sizes(), g.options().dtype(at::kFloat));
    DeviceBackward a;
    a.Q = Q.data_ptr(), a.K = K.data_ptr(), a.V = V.data_ptr(), a.dO = dOr.data_ptr();
    a.O = O.data_ptr(), a.lse = L.data_ptr<float>();
    a.dQ = sums[0].data_ptr(), a.dK = sums[1].data_ptr(), a.dV = sums[2].data_ptr();
    a.q_layout = q_at, a.k_layout = k_at, a.v_layout = v_at, a.do_layout = do_at;
    a.o_layout = o_in_place ? strides_of(o) : ArrayLayout{};
    if (plan.layouts) {
        a.dq_layout = strides_of(grads[0]), a.dk_layout = strides_of(grads[1]);
        a.dv_layout = strides_of(grads[2]);
    }
    a.dtype = plan.dtype;
    a.o_dtype = a.grad_dtype = plan.layouts ? plan.dtype : DType::f32;
    const at::Tensor ws = workspace(plan, q);
    a.workspace = ws.defined() ? ws.data_ptr() : nullptr, a.workspace_bytes = plan.workspace_bytes;
    a.stream = current_stream(q);
    plan.backend->run_backward_device(p, a);
    for (std::size_t i = 0; i < 3; ++i)
        if (!sums[i].is_same(grads[i])) grads[i].copy_(sums[i]);
    ++fast_backwards;
    return grads;
}

// --- the dispatcher's kernels --------------------------------------------------------------

std::optional<double> optional_double(const c10::IValue& x) {
    return x.isNone() ? std::nullopt : std::optional<double>(x.toDouble());
}
std::optional<std::string> optional_string(const c10::IValue& x) {
    return x.isNone() ? std::nullopt : std::optional<std::string>(x.toStringRef());
}

// An IValue of the schema's types (Tensor, bool, float?, str?, Tensor?, int[]?) as Python's.
py::object to_python(const c10::IValue& x) {
    if (x.isNone()) return py::none();
    if (x.isTensor()) return py::cast(x.toTensor());
    if (x.isBool()) return py::cast(x.toBool());
    if (x.isDouble()) return py::cast(x.toDouble());
    if (x.isString()) return py::cast(x.toStringRef());
    if (x.isIntList()) return py::cast(x.toIntVector());
    throw std::invalid_argument("flashattn operator: an argument of an unexpected type");
}

// An exception of the Python implementation as the dispatcher's: ValueError and TypeError keep
// their type (c10::ValueError, c10::TypeError, which PyTorch raises as those), anything else
// becomes a RuntimeError with the same message.
[[noreturn]] void rethrow_python(const std::string& type, const std::string& message) {
    if (type == "ValueError") TORCH_CHECK_VALUE(false, message);
    if (type == "TypeError") TORCH_CHECK_TYPE(false, message);
    TORCH_CHECK(false, type, ": ", message);
}

// The Python implementation `entry` on the n arguments at the top of the stack, its results
// pushed in their place.
void call_python(const py::object& entry, torch::jit::Stack* stack, std::size_t n) {
    std::string type, message;
    {
        py::gil_scoped_acquire gil;
        try {
            py::tuple args(n);
            auto given = torch::jit::last(*stack, n);
            for (std::size_t i = 0; i < n; ++i) args[i] = to_python(given[i]);
            py::tuple results = entry(*args);
            torch::jit::drop(*stack, n);
            for (auto result : results) torch::jit::push(*stack, result.cast<at::Tensor>());
            return;
        } catch (py::error_already_set& e) {
            type = py::str(e.type().attr("__name__"));
            message = py::str(e.value());
        }
    }
    rethrow_python(type, message);
}

// The library's std::invalid_argument as ValueError; Python's exceptions as rethrow_python says.
template <class Work>
void translated(Work work) {
    std::string type, message;
    try {
        work();
        return;
    } catch (const std::invalid_argument& e) {
        TORCH_CHECK_VALUE(false, e.what());
    } catch (py::error_already_set& e) {
        py::gil_scoped_acquire gil;
        type = py::str(e.type().attr("__name__"));
        message = py::str(e.value());
    }
    rethrow_python(type, message);
}

// flashattn::attention_forward(q, k, v, causal, scale, backend, block_mask, block_size)
void forward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
    constexpr std::size_t n = 8;
    auto args = torch::jit::last(*stack, n);
    std::optional<std::pair<at::Tensor, at::Tensor>> out;
    if (args[6].isNone() && args[7].isNone() && args[0].toTensor().dim() == 4) {
        translated([&] {
            out = fast_forward(args[0].toTensor(), args[1].toTensor(), args[2].toTensor(),
                               args[3].toBool(), optional_double(args[4]),
                               optional_string(args[5]));
        });
    }
    if (!out) return call_python(python_side->forward, stack, n);
    torch::jit::drop(*stack, n);
    torch::jit::push(*stack, std::move(out->first), std::move(out->second));
}

// flashattn::attention_backward(q, k, v, o, lse, do, causal, scale, backend, block_mask,
//                               block_size)
void backward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
    constexpr std::size_t n = 11;
    auto args = torch::jit::last(*stack, n);
    std::optional<std::array<at::Tensor, 3>> out;
    if (args[9].isNone() && args[10].isNone() && args[0].toTensor().dim() == 4) {
        translated([&] {
            out = fast_backward(args[0].toTensor(), args[1].toTensor(), args[2].toTensor(),
                                args[3].toTensor(), args[4].toTensor(), args[5].toTensor(),
                                args[6].toBool(), optional_double(args[7]),
                                optional_string(args[8]));
        });
    }
    if (!out) return call_python(python_side->backward, stack, n);
    torch::jit::drop(*stack, n);
    for (at::Tensor& g : *out) torch::jit::push(*stack, std::move(g));
}

// Registers the two kernels for the CUDA dispatch key (once; the operators are defined by the
// Python side first). plan, forward, backward: the Python side's _device_plan, and the Python
// implementations for the calls the fast path hands back.
void register_operators(py::object plan, py::object forward, py::object backward) {
    if (python_side) throw std::runtime_error("flashattn._torch_ops: registered already");
    python_side = new PythonSide{std::move(plan), std::move(forward), std::move(backward)};
    auto* library = new torch::Library(torch::Library::IMPL, "flashattn", c10::DispatchKey::CUDA,
                                       __FILE__, __LINE__);
    library->impl("attention_forward",
                  torch::CppFunction::makeFromBoxedFunction<&forward_kernel>());
    library->impl("attention_backward",
                  torch::CppFunction::makeFromBoxedFunction<&backward_kernel>());
}

// --- autograd of an eager call ------------------------------------------------------------
//
// An eager call that autograd records (tensors that require grad, grad mode on) goes through
// AttentionNode, a C++ autograd function: its forward is the operator's forward and its backward,
// which autograd's engine runs on its own thread, the operator's backward. With a Python
// autograd.Function in its place each training step's call paid Python twice more: its apply
// around the forward, and the engine taking the GIL to run its backward (docs/python.md,
// "The eager preset is bound by the host"). Both directions take the fast path above where
// they can and hand every other call to the Python implementation, as the dispatcher's kernels
// above do. (Calls with a block mask, on CPU tensors, or traced keep the Python Function and the
// operator: src/flashattn/__init__.py, _eager_forward.)

// read: the arrays the forward read (q, k, v, unless the fast path copied them).
std::pair<at::Tensor, at::Tensor> forward_of(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, bool causal,
                                             const std::optional<double>& scale,
                                             const std::optional<std::string>& backend,
                                             std::array<at::Tensor, 3>& read) {
    read = {q, k, v};
    if (q.dim() == 4) {
        if (auto out = fast_forward(q, k, v, causal, scale, backend, &read)) return *out;
    }
    py::gil_scoped_acquire gil;
    py::tuple out = python_side->forward(q, k, v, causal, scale, backend, py::none(),
                                         py::none());
    return {out[0].cast<at::Tensor>(), out[1].cast<at::Tensor>()};
}

std::array<at::Tensor, 3> backward_of(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& o,
                                      const at::Tensor& lse, const at::Tensor& dO, bool causal,
                                      const std::optional<double>& scale,
                                      const std::optional<std::string>& backend) {
    if (q.dim() == 4) {
        if (auto grads = fast_backward(q, k, v, o, lse, dO, causal, scale, backend)) return *grads;
    }
    py::gil_scoped_acquire gil;
    py::tuple grads = python_side->backward(q, k, v, o, lse, dO, causal, scale, backend,
                                            py::none(), py::none());
    return {grads[0].cast<at::Tensor>(), grads[1].cast<at::Tensor>(),
            grads[2].cast<at::Tensor>()};
}

struct AttentionNode : public torch::autograd::Function<AttentionNode> {
    // backward_backend: the backend the backward runs on (`_backward_backend` of `backend`).
    static torch::autograd::variable_list forward(
        torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
        const at::Tensor& v, bool causal, std::optional<double> scale,
        std::optional<std::string> backend, std::optional<std::string> backward_backend) {
        std::array<at::Tensor, 3> read;
        auto [O, L] = forward_of(q, k, v, causal, scale, backend, read);
        // Saved: the arrays the forward read. Where it copied a view (cuda-tc reads contiguous
        // arrays; cuda-fa3 and cuda-fa2 copy one TMA cannot read), the backward reads the same
        // copy instead of making its own, and writes the gradients in its order (contiguous)
        // with no copy into the views' order either: the same values, and the copies held in
        // the views' place.
        ctx->save_for_backward({read[0], read[1], read[2], O, L});
        ctx->mark_non_differentiable({L});  // LSE carries no gradient
        ctx->saved_data["causal"] = causal;
        ctx->saved_data["scale"] = scale ? c10::IValue(*scale) : c10::IValue();
        ctx->saved_data["backend"] =
            backward_backend ? c10::IValue(*backward_backend) : c10::IValue();
        return {O, L};
    }

    // grads: dL/dO, and LSE's (none). Errors surface as the dispatcher's kernels raise them.
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        const auto x = ctx->get_saved_variables();  // q, k, v, O, LSE
        std::array<at::Tensor, 3> dqkv;
        translated([&] {
            dqkv = backward_of(x[0], x[1], x[2], x[3], x[4], grads[0],
                               ctx->saved_data["causal"].toBool(),
                               optional_double(ctx->saved_data["scale"]),
                               optional_string(ctx->saved_data["backend"]));
        });
        return {dqkv[0], dqkv[1], dqkv[2], at::Tensor(), at::Tensor(), at::Tensor(),
                at::Tensor()};
    }
};

}  // namespace
}  // namespace flashattn::python

PYBIND11_MODULE(_torch_ops, m) {
    using namespace flashattn::python;
    m.doc() = "flashattn's operators on CUDA tensors in C++; use `import flashattn` instead.";
    m.def("register_operators", &register_operators);
    m.def("fast_calls", [] { return std::make_pair(fast_forwards.load(), fast_backwards.load()); },
          "(forward, backward): the calls the C++ fast path has run so far");
    // An eager call's fast path, without the dispatcher: (O, LSE), or None where the Python
    // implementation runs the call. The library's errors are ValueError (pybind11's translation
    // of std::invalid_argument), the planner's its own.
    m.def("forward", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        bool causal, std::optional<double> scale,
                        std::optional<std::string> backend) -> py::object {
        if (q.dim() != 4) return py::none();
        auto out = fast_forward(q, k, v, causal, scale, backend);
        if (!out) return py::none();
        return py::make_tuple(out->first, out->second);
    });
    m.def("backward", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& o, const at::Tensor& lse, const at::Tensor& dO,
                         bool causal, std::optional<double> scale,
                         std::optional<std::string> backend) -> py::object {
        if (q.dim() != 4) return py::none();
        auto out = fast_backward(q, k, v, o, lse, dO, causal, scale, backend);
        if (!out) return py::none();
        return py::make_tuple((*out)[0], (*out)[1], (*out)[2]);
    });
    // An eager call that autograd records, without a block mask: (O, LSE), O's gradient
    // flowing through AttentionNode. Errors are raised as `forward`'s are.
    m.def("attention", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          bool causal, std::optional<double> scale,
                          std::optional<std::string> backend,
                          std::optional<std::string> backward_backend) {
        auto out = AttentionNode::apply(q, k, v, causal, scale, backend, backward_backend);
        return py::make_tuple(out[0], out[1]);
    });
}
