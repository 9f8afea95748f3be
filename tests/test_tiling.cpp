// tests/test_tiling.cpp — tiles cover every index once; Algorithm 1 line 1; tile classification.
#include <algorithm>
#include <random>
#include <vector>

#include "catch.hpp"
#include "common/tiling.hpp"

using namespace flashattn;

TEST_CASE("tile ranges cover every index exactly once, with a ragged tail") {
    for (std::int64_t n : {1, 2, 7, 64, 113, 203, 1023, 1024})
        for (std::int64_t block : {1, 3, 16, 64, 100, 2000}) {
            std::vector<int> hits(n, 0);
            const std::int64_t T = tile_count(n, block);
            for (std::int64_t t = 0; t < T; ++t) {
                const TileRange r = tile_range(t, block, n);
                REQUIRE(r.size() >= 1);
                REQUIRE(r.size() <= block);
                for (std::int64_t i = r.begin; i < r.end; ++i) ++hits[i];
            }
            for (std::int64_t i = 0; i < n; ++i) REQUIRE(hits[i] == 1);
        }
}

TEST_CASE("Algorithm 1 line 1: Bc = ceil(M/4d), Br = min(ceil(M/4d), d)") {
    CHECK(block_sizes_from_sram(16384, 64).Bc == 64);
    CHECK(block_sizes_from_sram(16384, 64).Br == 64);
    CHECK(block_sizes_from_sram(16384, 32).Bc == 128);
    CHECK(block_sizes_from_sram(16384, 32).Br == 32);  // capped by d
    CHECK(block_sizes_from_sram(100, 3).Bc == 9);      // ceil(100 / 12)
    CHECK(block_sizes_from_sram(100, 3).Br == 3);
    CHECK(block_sizes_from_sram(4 * 59, 59).Bc == 1);  // the smallest M allowed
    CHECK(block_sizes_from_sram(4 * 59, 59).Br == 1);
}

TEST_CASE("tile classification agrees with the element-wise masks") {
    std::mt19937 gen(Catch::rngSeed() + 11);
    for (int trial = 0; trial < 300; ++trial) {
        AttentionProblem p;
        p.seq_q = 1 + gen() % 40;
        p.seq_kv = 1 + gen() % 40;
        p.dim = 4;
        p.causal = gen() % 2;
        std::vector<std::uint8_t> mask;
        if (gen() % 2) {
            p.block_mask.block_q = 1 + gen() % 6;
            p.block_mask.block_kv = 1 + gen() % 6;
            mask.resize(tile_count(p.seq_q, p.block_mask.block_q) *
                        tile_count(p.seq_kv, p.block_mask.block_kv));
            for (auto& m : mask) m = gen() % 3 != 0;
            p.block_mask.data = mask.data();
        }
        const std::int64_t Br = 1 + gen() % 9, Bc = 1 + gen() % 9;
        for (std::int64_t i = 0; i < tile_count(p.seq_q, Br); ++i)
            for (std::int64_t j = 0; j < tile_count(p.seq_kv, Bc); ++j) {
                const TileRange rows = tile_range(i, Br, p.seq_q), cols = tile_range(j, Bc, p.seq_kv);
                int visible = 0;
                for (std::int64_t r = rows.begin; r < rows.end; ++r)
                    for (std::int64_t c = cols.begin; c < cols.end; ++c) visible += p.key_visible(r, c);
                const TileVisibility v = classify_tile(p, rows, cols);
                INFO("trial " << trial << " tile " << i << "," << j);
                if (visible == 0) CHECK(v == TileVisibility::none);
                else if (visible == rows.size() * cols.size()) CHECK(v == TileVisibility::full);
                else CHECK(v == TileVisibility::partial);
            }
    }
}

TEST_CASE("problem validation names the field and the value") {
    AttentionProblem p;
    p.seq_q = 4, p.seq_kv = 4, p.dim = 8;
    CHECK_NOTHROW(validate(p));
    auto bad = p;
    bad.heads = 6, bad.heads_kv = 4;
    CHECK_THROWS_WITH(validate(bad), Catch::Contains("heads_kv = 4"));
    bad = p;
    bad.dim = 257;
    CHECK_THROWS_WITH(validate(bad), Catch::Contains("dim = 257"));
    bad = p;
    bad.seq_q = 0;
    CHECK_THROWS_WITH(validate(bad), Catch::Contains("seq_q = 0"));
    bad = p;
    bad.scale = INFINITY;
    CHECK_THROWS_AS(validate(bad), std::invalid_argument);
    bad = p;
    bad.batch = std::int64_t{1} << 30, bad.heads = 1 << 20, bad.seq_q = 1 << 20;
    CHECK_THROWS_WITH(validate(bad), Catch::Contains("Q elements"));
}

// causal_key_tiles against the element-wise mask: the tiles before `full` are fully visible to
// every row (and whole: not the ragged last tile), every tile before `seen` is visible to some
// row, and none from `seen` on is.
TEST_CASE("causal_key_tiles splits a row range's key tiles as the element-wise mask does") {
    std::mt19937 gen(Catch::rngSeed() + 13);
    for (int trial = 0; trial < 500; ++trial) {
        AttentionProblem p;
        p.seq_q = 1 + gen() % 60;
        p.seq_kv = 1 + gen() % 60;
        p.dim = 4;
        p.causal = gen() % 4 != 0;
        const std::int64_t block = 1 + gen() % 12;
        const std::int64_t r0 = gen() % (p.seq_q + 1), r1 = r0 + gen() % (p.seq_q - r0 + 1);
        const TileRange rows = {r0, r1};
        const KeyTileSplit split = causal_key_tiles(p, rows, block);
        INFO("trial " << trial << " rows [" << r0 << ", " << r1 << ") block " << block << " Nkv "
                      << p.seq_kv << " causal " << p.causal);
        REQUIRE(0 <= split.full);
        REQUIRE(split.full <= split.seen);
        REQUIRE(split.seen <= tile_count(p.seq_kv, block));
        for (std::int64_t j = 0; j < tile_count(p.seq_kv, block); ++j) {
            const TileRange cols = tile_range(j, block, p.seq_kv);
            std::int64_t visible = 0;
            for (std::int64_t r = rows.begin; r < rows.end; ++r)
                for (std::int64_t c = cols.begin; c < cols.end; ++c) visible += p.key_visible(r, c);
            const bool whole = cols.size() == block;
            CHECK((j < split.full) == (whole && visible == rows.size() * block && rows.size() > 0));
            CHECK((j < split.seen) == (visible > 0));
        }
    }
}

// query_tile_shift: under a causal mask whole units (warpgroups) of the short tile's missing rows
// go below row 0, into the first tile. The shifted tiles must still hold every row once, and the
// key tiles their units see (causal_key_tiles of each unit's rows, the rows below 0 and past N_q
// included, as cuda-fa3's warpgroups ask) must never add up to more than without the shift, nor
// need the mask on more of them.
TEST_CASE("query tiles cut from the end under a causal mask: every row once, never more key tiles") {
    for (std::int64_t Nq : {1, 63, 64, 65, 130, 333, 1000, 1024, 2047})
        for (std::int64_t extra : {-50, 0, 300})
            for (std::int64_t Br : {64, 128, 192}) {
                AttentionProblem p;
                p.seq_q = Nq;
                p.seq_kv = std::max<std::int64_t>(1, Nq + extra);
                p.dim = 64;
                p.causal = true;
                const std::int64_t unit = 64, Tr = tile_count(Nq, Br);
                const std::int64_t shift = query_tile_shift(p, Br, unit);
                INFO("Nq " << Nq << " Nkv " << p.seq_kv << " Br " << Br << " shift " << shift);
                REQUIRE(shift >= 0);
                REQUIRE(shift % unit == 0);
                REQUIRE(Tr * Br - shift >= Nq);  // the last tile still reaches the last row,
                REQUIRE(Tr * Br - shift - Nq < unit);  // short of it by less than a unit
                std::vector<int> hits(Nq, 0);
                std::int64_t seen[2] = {0, 0}, masked[2] = {0, 0};  // [0]: from row 0
                for (std::int64_t i = 0; i < Tr; ++i) {
                    const std::int64_t begin = i * Br - shift;
                    for (std::int64_t r = std::max<std::int64_t>(begin, 0);
                         r < std::min(begin + Br, Nq); ++r)
                        ++hits[r];
                    for (std::int64_t u = 0; u < Br; u += unit)  // a unit's rows in [0, N_q)
                        for (int shifted = 0; shifted < 2; ++shifted) {
                            const std::int64_t b = (shifted ? begin : i * Br) + u;
                            const auto clip = [&](std::int64_t r) {
                                return std::min(std::max<std::int64_t>(r, 0), Nq);
                            };
                            const TileRange rows = {clip(b), clip(b + unit)};
                            const KeyTileSplit split = causal_key_tiles(p, rows, 128);
                            seen[shifted] += split.seen;
                            masked[shifted] += split.seen - split.full;
                        }
                }
                for (int h : hits) REQUIRE(h == 1);
                CHECK(seen[1] <= seen[0]);
                CHECK(masked[1] <= masked[0]);
                p.causal = false;  // every tile sees every key: cut from row 0
                CHECK(query_tile_shift(p, Br, unit) == 0);
                p.causal = true;
                const std::uint8_t on = 1;  // a block mask: its rows of blocks start at row 0
                p.block_mask = {&on, Nq, p.seq_kv};
                CHECK(query_tile_shift(p, Br, unit) == 0);
            }
}

TEST_CASE("last_causal_key and first_causal_row bound exactly what the causal mask lets see") {
    std::mt19937 gen(Catch::rngSeed() + 29);
    for (int trial = 0; trial < 200; ++trial) {
        AttentionProblem p;
        p.seq_q = 1 + gen() % 70, p.seq_kv = 1 + gen() % 70, p.dim = 8;
        p.causal = gen() % 4 != 0;
        // A row's visible keys among those before `end` are 0 .. last.
        for (std::int64_t i = 0; i < p.seq_q; ++i)
            for (std::int64_t end = 0; end <= p.seq_kv; ++end) {
                const std::int64_t last = p.last_causal_key(i, end);
                for (std::int64_t j = 0; j < end; ++j)
                    REQUIRE(p.causal_visible(i, j) == (j <= last));
                REQUIRE(last <= end - 1);
            }
        // A key's visible rows are first .. seq_q - 1.
        for (std::int64_t j = 0; j < p.seq_kv; ++j) {
            const std::int64_t first = p.first_causal_row(j);
            for (std::int64_t i = 0; i < p.seq_q; ++i)
                REQUIRE(p.causal_visible(i, j) == (i >= first));
        }
    }
}

TEST_CASE("the GPU schedule numbers every tile once, a unit's ranks in order, the tail rank-major") {
    for (std::int64_t T : {1, 2, 3, 8, 17})
        for (std::int64_t units : {1, 5, 96, 200}) {
            const std::int64_t tail = schedule_tail(true, T, units, 132);
            INFO("T " << T << ", units " << units << ", tail " << tail);
            // The fewest units whose tiles make two waves of 132 CTAs, or every unit; none when
            // the tiles of a unit are all alike (one tile, or no causal mask).
            if (T < 2) {
                REQUIRE(tail == 0);
            } else {
                REQUIRE(tail <= units);
                REQUIRE((tail == units || tail * T >= 2 * 132));
                REQUIRE((tail - 1) * T < 2 * 132);
            }
            REQUIRE(schedule_tail(false, T, units, 132) == 0);
            std::vector<int> hits(units * T, 0);
            std::vector<std::int64_t> next_rank(units, 0);
            std::int64_t last_rank_in_tail = 0;
            for (std::int64_t item = 0; item < units * T; ++item) {
                const ScheduledTile<std::int64_t> s = scheduled_tile(item, T, units, tail);
                REQUIRE(s.unit >= 0);
                REQUIRE(s.unit < units);
                REQUIRE(s.rank == next_rank[s.unit]++);  // rank r - 1 of a unit before rank r
                ++hits[s.unit * T + s.rank];
                if (s.unit >= units - tail) {  // the tail: rank by rank across its units
                    REQUIRE(item >= (units - tail) * T);
                    REQUIRE(s.rank >= last_rank_in_tail);
                    last_rank_in_tail = s.rank;
                } else {
                    REQUIRE(s.unit == item / T);  // side by side, as a (T, units) grid
                }
            }
            for (int h : hits) REQUIRE(h == 1);
            // The int form the kernels use gives the same order.
            for (int item = 0; item < int(units * T); ++item) {
                const ScheduledTile<int> s = scheduled_tile(item, int(T), int(units), int(tail));
                const ScheduledTile<std::int64_t> w = scheduled_tile<std::int64_t>(item, T, units, tail);
                REQUIRE(s.unit == w.unit);
                REQUIRE(s.rank == w.rank);
            }
        }
}
