// examples/flashattn/gemm_ceiling.cpp — see gemm_ceiling.hpp.
#include "gemm_ceiling.hpp"

#include <Eigen/Dense>

namespace flashattn::cli {

struct SgemmCeiling::Matrices {
    Eigen::MatrixXf A, B, C;
};

SgemmCeiling::SgemmCeiling() : m_(std::make_unique<Matrices>()) {
    m_->A = Eigen::MatrixXf::Random(kSize, kSize);
    m_->B = Eigen::MatrixXf::Random(kSize, kSize);
    m_->C = Eigen::MatrixXf::Zero(kSize, kSize);
}

SgemmCeiling::~SgemmCeiling() = default;

void SgemmCeiling::run() { m_->C.noalias() = m_->A * m_->B; }

}  // namespace flashattn::cli
