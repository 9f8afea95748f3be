// examples/figure6_problem.hpp — the one small problem that examples 02, 03, 06 and 07 trace:
// N = 12 query and key rows, head dimension d = 4, blocks of Br = 3 query rows and Bc = 2 key
// rows (Tr = 4 query blocks, Tc = 6 key/value blocks; 24 tiles S_ij of 3 x 2). The name is the
// blocking figure (figure 6) of the walkthrough at https://zhuanlan.zhihu.com/p/626079753, which
// draws this N = 12, Br = 3, Bc = 2 grid.
//
// Inputs are seeded standard-normal values rounded to two decimals, so the printed Q, K, V (and
// the backward's dO) are exactly the numbers the algorithms compute with.
#pragma once

#include <cmath>
#include <vector>

#include "common/problem.hpp"
#include "cpu/reference.hpp"

namespace flashattn::examples {

struct Figure6 {
    AttentionProblem problem;
    ProblemData data;
};

inline Figure6 figure6_problem() {
    Figure6 f;
    f.problem.seq_q = f.problem.seq_kv = 12;
    f.problem.dim = 4;
    f.problem.block_q = 3;   // Br
    f.problem.block_kv = 2;  // Bc
    validate(f.problem);
    f.data = random_problem_data(f.problem, /*seed=*/6);
    for (auto* m : {&f.data.Q, &f.data.K, &f.data.V})
        for (float& x : *m) x = std::round(x * 100.0f) / 100.0f;
    return f;
}

// The backward's upstream gradient dO = dloss/dO of examples 06 and 07 (the same numbers in both).
inline std::vector<float> figure6_output_gradient(const AttentionProblem& p) {
    std::vector<float> dO = random_normal(p.q_elements(), /*seed=*/66);
    for (float& x : dO) x = std::round(x * 100.0f) / 100.0f;
    return dO;
}

}  // namespace flashattn::examples
