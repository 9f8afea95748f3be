// tests/test_scalar_trace.cpp — the observer hook of the scalar form (ScalarTrace, cpu/scalar.hpp)
// that examples/02 and 03 print with: it must see every visited tile once, in Algorithm 1's order,
// show the right buffers, and change nothing.
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "cpu/scalar.hpp"
#include "helpers.hpp"

using namespace flashattn;

namespace {

// Records what it is shown and checks it against the inputs as it goes.
class CheckingTrace : public ScalarTrace {
public:
    CheckingTrace(const AttentionProblem& p, const ProblemData& in) : p_(p), in_(in) {}

    void after_scores(const ScalarStep& s) override {
        ++scores_calls;
        // Algorithm 1's order: j outer, i inner, within one (batch, head).
        const auto key = std::make_tuple(s.batch, s.head, s.j, s.i);
        if (scores_calls > 1) CHECK(key > last_key_);
        last_key_ = key;
        // S_ij is scale * Q_i K_j^T, or -inf where masked, computed here independently.
        const float* Q = in_.Q.data() + p_.q_offset(s.batch, s.head);
        const float* K = in_.K.data() + p_.kv_offset(s.batch, s.head);
        for (std::int64_t r = 0; r < s.rows.size(); ++r)
            for (std::int64_t c = 0; c < s.cols.size(); ++c) {
                const std::int64_t i = s.rows.begin + r, j = s.cols.begin + c;
                const float got = s.S_ij[r * s.Bc + c];
                if (!p_.key_visible(i, j)) {
                    CHECK(got == -INFINITY);
                    continue;
                }
                double dot = 0;
                for (std::int64_t k = 0; k < p_.dim; ++k) dot += double(Q[i * p_.dim + k]) * K[j * p_.dim + k];
                CHECK(std::fabs(got - p_.softmax_scale() * dot) <= 1e-4);
            }
        // m_i, l_i loaded at line 8 are what line 13 wrote at this row block's previous step.
        auto& last = last_stats_[{s.batch, s.head, s.i}];
        for (std::int64_t r = 0; r < s.rows.size(); ++r) {
            CHECK(s.m_i[r] == (last.empty() ? -INFINITY : last[2 * r]));
            CHECK(s.l_i[r] == (last.empty() ? 0.0f : last[2 * r + 1]));
        }
    }

    void after_update(const ScalarStep& s) override {
        ++update_calls;
        auto& last = last_stats_[{s.batch, s.head, s.i}];
        last.assign(2 * s.rows.size(), 0.0f);
        for (std::int64_t r = 0; r < s.rows.size(); ++r) last[2 * r] = s.m_i[r], last[2 * r + 1] = s.l_i[r];
        auto& O_last = last_O[{s.batch, s.head, s.i}];
        O_last.assign(s.O_i, s.O_i + s.rows.size() * s.d);
    }

    int scores_calls = 0, update_calls = 0;
    std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::vector<float>> last_O;

private:
    const AttentionProblem& p_;
    const ProblemData& in_;
    std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t> last_key_;
    std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::vector<float>> last_stats_;
};

}  // namespace

TEST_CASE("scalar trace: sees each visited tile once, in order, with the right buffers, and changes nothing") {
    AttentionProblem p;
    p.batch = 2, p.heads = 3, p.heads_kv = GENERATE(1, 3);
    p.seq_q = GENERATE(7, 13), p.seq_kv = 13, p.dim = 3;
    p.block_q = 3, p.block_kv = 5;
    p.causal = GENERATE(false, true);
    INFO(test::describe(p));
    const ProblemData in = random_problem_data(p, test::next_seed());

    std::vector<float> O_plain(p.q_elements(), NAN), O_traced(p.q_elements(), NAN);
    std::vector<float> lse_plain(p.lse_elements(), NAN), lse_traced(p.lse_elements(), NAN);
    scalar_attention(p, in.Q.data(), in.K.data(), in.V.data(), O_plain.data(), lse_plain.data());
    CheckingTrace trace(p, in);
    scalar_attention(p, in.Q.data(), in.K.data(), in.V.data(), O_traced.data(), lse_traced.data(),
                     nullptr, &trace);

    // Observing changes nothing, to the bit.
    CHECK(std::memcmp(O_plain.data(), O_traced.data(), O_plain.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(lse_plain.data(), lse_traced.data(), lse_plain.size() * sizeof(float)) == 0);

    // One call of each hook per visited tile.
    const ScalarPlan plan = scalar_plan(p);
    int visited = 0;
    for (std::int64_t j = 0; j < plan.Tc; ++j)
        for (std::int64_t i = 0; i < plan.Tr; ++i)
            visited += classify_tile(p, tile_range(i, plan.blocks.Br, p.seq_q),
                                     tile_range(j, plan.blocks.Bc, p.seq_kv)) != TileVisibility::none;
    CHECK(trace.scores_calls == visited * p.batch * p.heads);
    CHECK(trace.update_calls == visited * p.batch * p.heads);

    // The O_i of a row block's last step is what ends up in O.
    for (const auto& [key, O_i] : trace.last_O) {
        const auto [b, h, i] = key;
        const float* O = O_plain.data() + p.q_offset(b, h) + i * plan.blocks.Br * p.dim;
        for (std::size_t x = 0; x < O_i.size(); ++x) CHECK(O_i[x] == O[x]);
    }
}
