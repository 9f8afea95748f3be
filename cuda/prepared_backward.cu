// cuda/prepared_backward.cu — see prepared_backward.hpp.
#include "cuda/prepared_backward.hpp"

#include <stdexcept>

namespace flashattn::cuda {

PreparedCudaBackward::PreparedCudaBackward(const std::string& backend_name,
                                           const AttentionProblem& problem,
                                           const BackwardInputs& in, DType dtype)
    : problem_(problem) {
    validate(problem);
    require_backward_inputs(in);
    if (dtype != DType::f32)
        throw std::invalid_argument("dtype = " + to_string(dtype) + ": " + backend_name +
                                    "'s backward computes in float32 only");
    Q_ = upload_floats(in.Q, problem.q_elements());
    K_ = upload_floats(in.K, problem.kv_elements());
    V_ = upload_floats(in.V, problem.kv_elements());
    O_ = upload_floats(in.O, problem.q_elements());
    dO_ = upload_floats(in.dO, problem.q_elements());
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
