// examples/figure6_problem.hpp — the one small problem that examples 02 and 03 trace: N = 12,
// d = 4, Br = 3, Bc = 2, a blocking small enough to print (Tr = 4 query blocks of 3 rows,
// Tc = 6 key/value blocks of 2 rows; 24 tiles S_ij of 3 x 2).
//
// Inputs are seeded standard-normal values rounded to two decimals, so the printed Q, K, V are
// exactly the numbers the algorithms compute with.
#pragma once

#include <cmath>

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

}  // namespace flashattn::examples
