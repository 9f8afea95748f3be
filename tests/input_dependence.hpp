// tests/input_dependence.hpp — which inputs each output element reads, by docs/design.md's masking
// rules, worked out from the problem alone (never from a backend): O[i][c] reads Q_i, and K_j and
// V_j[c] of every key j that row i attends; LSE[i] reads Q_i and K_j of every attended key. A
// row that attends no key reads nothing (it is O = 0, LSE = -inf).
//
// With it, docs/design.md's NaN rule (Numerics) is one line: an output is NaN exactly when it reads a NaN. The
// edge-case tests and the backend fuzzer both check it this way.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/problem.hpp"
#include "cpu/reference.hpp"

namespace flashattn::test {

// One flag per element of O (batch, heads, seq_q, dim) and of LSE (batch, heads, seq_q).
struct OutputFlags {
    std::vector<bool> O, lse;
    bool operator==(const OutputFlags& o) const { return O == o.O && lse == o.lse; }
};

// For every output element: does it read an input value x with pred(x)?
template <class Pred>
OutputFlags reads_any(const AttentionProblem& p, const ProblemData& in, Pred pred) {
    OutputFlags f{std::vector<bool>(p.q_elements()), std::vector<bool>(p.lse_elements())};
    const std::int64_t d = p.dim;
    const auto row_any = [&](const std::vector<float>& x, std::int64_t begin) {
        for (std::int64_t c = 0; c < d; ++c)
            if (pred(x[begin + c])) return true;
        return false;
    };
    std::vector<bool> value_hit(d);
    for (std::int64_t b = 0; b < p.batch; ++b)
        for (std::int64_t h = 0; h < p.heads; ++h) {
            const std::int64_t q0 = p.q_offset(b, h), kv0 = p.kv_offset(b, h);
            for (std::int64_t i = 0; i < p.seq_q; ++i) {
                bool attends = false, score_hit = row_any(in.Q, q0 + i * d);
                value_hit.assign(d, false);
                for (std::int64_t j = 0; j < p.seq_kv; ++j) {
                    if (!p.key_visible(i, j)) continue;
                    attends = true;
                    score_hit = score_hit || row_any(in.K, kv0 + j * d);
                    for (std::int64_t c = 0; c < d; ++c)
                        value_hit[c] = value_hit[c] || pred(in.V[kv0 + j * d + c]);
                }
                f.lse[p.lse_offset(b, h) + i] = attends && score_hit;
                for (std::int64_t c = 0; c < d; ++c)
                    f.O[q0 + i * d + c] = attends && (score_hit || value_hit[c]);
            }
        }
    return f;
}

// Where docs/design.md's NaN rule (Numerics) puts NaN in the outputs.
inline OutputFlags expected_nans(const AttentionProblem& p, const ProblemData& in) {
    return reads_any(p, in, [](float x) { return x != x; });
}

// Where outputs actually hold NaN.
template <class T>
OutputFlags nans_of(const std::vector<T>& O, const std::vector<T>& lse) {
    OutputFlags n{std::vector<bool>(O.size()), std::vector<bool>(lse.size())};
    for (std::size_t k = 0; k < O.size(); ++k) n.O[k] = O[k] != O[k];
    for (std::size_t k = 0; k < lse.size(); ++k) n.lse[k] = lse[k] != lse[k];
    return n;
}

}  // namespace flashattn::test
