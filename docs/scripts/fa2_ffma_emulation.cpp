// docs/scripts/fa2_ffma_emulation.cpp — cuda-fa2's FFMA kernel (cuda/fa2/backend.cu, v3) as it was until
// 2026-11-23, re-done on the CPU in the same float operations and order, one row at a time (lanes
// as in Fa2Config: the row sum l split over CG lanes and added by a butterfly at the end; O as one
// fmaf chain over every key), to find where its error at d = 3, N_kv = 1023 came from without a
// GPU. The kernel now does mode 1 below (on the H100: 0.475 of the bound over 3 seeds).
//
// It replays the inputs of test_variants --rng-seed 2 around the failing check (the check's seed
// is 0x5eed0002 + 7919 * call, call = 272 for cuda-fa2 at B=2 H=3 N_q=59 N_kv=1023 d=3) and prints
// error / bound for Bc = 32 and 64 and three ways to sum P V:
//   mode 0: as the kernel does (o *= alpha, then o += p v over the tile's keys);
//   mode 1: each tile's P V into a fresh accumulator, o = alpha o + tile sum;
//   mode 2: o in double (how much of the error is the P V sum at all).
// Measured 2026-11-23: call 272 gives 1.227 / 0.483 / 0.654 (Bc = 32) and 1.569 / 0.236 / 0.312
// (Bc = 64); the GPU gave 1.373 and 1.683 for mode 0. So the failure is the arithmetic, not a race.
//
// Build (after cmake --workflow --preset release, CUDA on):
//   g++ -O2 -std=c++17 -I. -I/usr/include/eigen3 \
//       docs/scripts/fa2_ffma_emulation.cpp build/release/libflashattn_backends.a build/release/cuda/libflashattn_cuda.a \
//       build/release/cpu/libflashattn_cpu.a -L/usr/local/cuda/lib64 -lcudart -lcublas -fopenmp \
//       -o /tmp/fa2_emu && LD_LIBRARY_PATH=/usr/local/cuda/lib64 /tmp/fa2_emu
#include <cmath>
#include <cstdio>
#include <vector>
#include "common/registry.hpp"
#include "cpu/reference.hpp"
using namespace flashattn;

static void fa2_emu(const AttentionProblem& p, const ProblemData& in, int Bc, int CG, int mode,
                    std::vector<float>& O) {
    const int d = p.dim, N = p.seq_kv;
    const float scale = p.softmax_scale();
    for (std::int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
        const float* Q = in.Q.data() + bh * p.seq_q * d;
        const float* K = in.K.data() + bh * N * d;  // H == Hkv here
        const float* V = in.V.data() + bh * N * d;
        for (int r = 0; r < p.seq_q; ++r) {
            float m = -INFINITY;
            std::vector<float> l(CG, 0.0f);
            std::vector<float> o(d, 0.0f);
            std::vector<double> od(d, 0.0);
            for (int j0 = 0; j0 < N; j0 += Bc) {
                const int j1 = std::min(N, j0 + Bc);
                std::vector<float> x(Bc, -INFINITY);
                float row_max = -INFINITY;
                for (int c = j0; c < j1; ++c) {
                    float s = 0.0f;
                    for (int k = 0; k < d; ++k) s = std::fmaf(Q[r * d + k], K[c * d + k], s);
                    x[c - j0] = s * scale;
                    row_max = std::max(row_max, x[c - j0]);
                }
                const float m_new = std::max(m, row_max);
                const float alpha = m == -INFINITY ? 0.0f : std::exp(m - m_new);
                m = m_new;
                std::vector<float> P(Bc, 0.0f), row_sum(CG, 0.0f);
                for (int c = 0; c < Bc; ++c) {
                    P[c] = x[c] == -INFINITY ? 0.0f : std::exp(x[c] - m_new);
                    row_sum[c % CG] += P[c];
                }
                for (int g = 0; g < CG; ++g) l[g] = alpha * l[g] + row_sum[g];
                for (int e = 0; e < d; ++e) {
                    if (mode == 1) {
                        float acc = 0.0f;
                        for (int c = j0; c < j1; ++c) acc = std::fmaf(P[c - j0], V[c * d + e], acc);
                        o[e] = std::fmaf(alpha, o[e], acc);
                    } else {
                        o[e] *= alpha;
                        od[e] *= alpha;
                        for (int c = j0; c < j1; ++c) {
                            o[e] = std::fmaf(P[c - j0], V[c * d + e], o[e]);
                            od[e] += double(P[c - j0]) * V[c * d + e];
                        }
                    }
                }
            }
            // lanes_sum: butterfly over CG lanes
            std::vector<float> lv = l;
            for (int off = CG / 2; off >= 1; off /= 2) {
                std::vector<float> nv(CG);
                for (int g = 0; g < CG; ++g) nv[g] = lv[g] + lv[g ^ off];
                lv = nv;
            }
            for (int e = 0; e < d; ++e)
                O[(bh * p.seq_q + r) * d + e] = mode == 2 ? float(od[e] / lv[0]) : o[e] / lv[0];
        }
    }
}

int main() {
    AttentionProblem p;
    p.batch = 2, p.heads = 3, p.heads_kv = 3, p.seq_q = 59, p.seq_kv = 1023, p.dim = 3;
    std::printf("error / bound per check; columns: Bc=32 mode 0, 1, 2, then Bc=64 mode 0, 1, 2\n");
    for (int call = 255; call <= 285; ++call) {
        const std::uint64_t seed = 0x5eed0002ull + std::uint64_t(call) * 7919;
        const ProblemData in = random_problem_data(p, seed);
        const Reference ref = reference_attention(p, in.Q.data(), in.K.data(), in.V.data());
        std::vector<float> Os(p.q_elements()), lse(p.lse_elements());
        run_backend(find_backend("standard"), p, in.Q.data(), in.K.data(), in.V.data(), Os.data(), lse.data(), DType::f32);
        const double bound = 2 * max_abs_error(Os.data(), ref.O.data(), p.q_elements()) + 1e-6;
        std::printf("call %d:", call);
        for (int bc : {32, 64}) for (int mode = 0; mode < 3; ++mode) {
            std::vector<float> O(p.q_elements());
            fa2_emu(p, in, bc, 8, mode, O);
            std::printf(" %.3f", max_abs_error(O.data(), ref.O.data(), p.q_elements()) / bound);
        }
        std::printf("\n");
    }
}
