// cuda/host/prepared_backward.cu — see cuda/host/prepared_backward.hpp.
#include "cuda/host/prepared_backward.hpp"

#include <stdexcept>

namespace flashattn::cuda {

PreparedCudaBackward::PreparedCudaBackward(const std::string& backend_name,
                                           const AttentionProblem& problem,
                                           const BackwardInputs& in, DType dtype, InputForm form)
    : problem_(problem), dtype_(dtype) {
    validate(problem);
    require_backward_inputs(in);
    if (form == InputForm::f32) {
        if (dtype != DType::f32)
            throw std::invalid_argument("dtype = " + to_string(dtype) + ": " + backend_name +
                                        "'s backward computes in float32 only");
        Q_ = upload_floats(in.Q, problem.q_elements());
        K_ = upload_floats(in.K, problem.kv_elements());
        V_ = upload_floats(in.V, problem.kv_elements());
        dO_ = upload_floats(in.dO, problem.q_elements());
    } else {
        if (dtype != DType::f16 && dtype != DType::bf16)
            throw std::invalid_argument("dtype = " + to_string(dtype) + ": " + backend_name +
                                        "'s backward computes in f16 or bf16 (tensor cores)");
        Q16_ = upload_bits(in.Q, problem.q_elements(), dtype, q_sign(problem));
        K16_ = upload_bits(in.K, problem.kv_elements(), dtype, 1.0f);
        V16_ = upload_bits(in.V, problem.kv_elements(), dtype, 1.0f);
        dO16_ = upload_bits(in.dO, problem.q_elements(), dtype, 1.0f);
    }
    O_ = upload_floats(in.O, problem.q_elements());
    lse_ = upload_floats(in.lse, problem.lse_elements());
    dQ_ = DeviceBuffer<float>(static_cast<std::size_t>(problem.q_elements()));
    dK_ = DeviceBuffer<float>(static_cast<std::size_t>(problem.kv_elements()));
    dV_ = DeviceBuffer<float>(static_cast<std::size_t>(problem.kv_elements()));
    dQ_.poison();
    dK_.poison();
    dV_.poison();
    mask_ = upload_block_mask(problem_);
}

void PreparedCudaBackward::fetch(float* dQ, float* dK, float* dV) {
    require_array(dQ, "dQ"), require_array(dK, "dK"), require_array(dV, "dV");
    dQ_.download(dQ);
    dK_.download(dK);
    dV_.download(dV);
}

}  // namespace flashattn::cuda
