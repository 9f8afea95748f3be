// examples/flashattn/run_command.cpp — `flashattn run`: one backend on .npy inputs.
//
// Everything is read and checked, and the result computed, before any output is written; the
// outputs are then written atomically (output_files.hpp), so a failure leaves no partial file.
// An output that is the same file as an input (however spelled, linked or hard-linked), or as
// another output, is refused before any work.
//
// With --dout/--dq/--dk/--dv the backward pass (paper Section 3.1, Algorithm 4) runs after the
// forward, on the forward's own O and LSE (the statistics it saves instead of P), and the three
// gradients join O and LSE in the one atomic write: all five files appear, or none changes.
#include <iostream>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "common/tiling.hpp"
#include "common/registry.hpp"
#include "npy.hpp"
#include "number_options.hpp"
#include "output_files.hpp"
#include "tile_options.hpp"

namespace flashattn::cli {
namespace {

struct RunOptions {
    std::string backend, q, k, v, out, lse, block_mask, dtype = "f32";
    std::string dout, dq, dk, dv;  // the backward's input dO and its outputs: all four or none
    std::optional<std::string> scale;  // as given: read as float32 by parse_float32
    bool causal = false;
    TileOptions tiles;
};

std::string shape_str(const std::vector<std::int64_t>& s) {
    std::string r = "(";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + ")";
}

// (N, d) means B = H = 1; otherwise (B, H, N, d). `what` names the option ("--q") in errors.
void read_shape(const npy::Array& a, const std::string& what, std::int64_t& B, std::int64_t& H,
                std::int64_t& N, std::int64_t& d) {
    if (a.shape.size() == 2) {
        B = 1, H = 1, N = a.shape[0], d = a.shape[1];
    } else if (a.shape.size() == 4) {
        B = a.shape[0], H = a.shape[1], N = a.shape[2], d = a.shape[3];
    } else {
        throw std::invalid_argument(what + " shape " + shape_str(a.shape) +
                                    ": must be (B, H, N, d) or (N, d)");
    }
}

// Whether the backward was asked for: --dout, --dq, --dk and --dv all given, or none of them
// (half a backward, say dO without somewhere to put dV, is a mistake, never a silent partial run).
bool wants_backward(const RunOptions& o) {
    const std::vector<std::pair<const char*, const std::string*>> options = {
        {"--dout", &o.dout}, {"--dq", &o.dq}, {"--dk", &o.dk}, {"--dv", &o.dv}};
    std::string missing;
    std::size_t given = 0;
    for (const auto& [name, value] : options) {
        if (value->empty())
            missing += std::string(" ") + name;
        else
            ++given;
    }
    if (given == 0) return false;
    if (given == options.size()) return true;
    throw std::invalid_argument("--dout, --dq, --dk and --dv go together (the backward pass): "
                                "missing" + missing);
}

// The files `run` reads, and those it writes, as the options named them.
std::vector<FileArgument> input_files(const RunOptions& o, bool backward) {
    std::vector<FileArgument> inputs = {{"--q", o.q}, {"--k", o.k}, {"--v", o.v}};
    if (!o.block_mask.empty()) inputs.push_back({"--block-mask", o.block_mask});
    if (backward) inputs.push_back({"--dout", o.dout});
    return inputs;
}
std::vector<FileArgument> output_files(const RunOptions& o, bool backward) {
    std::vector<FileArgument> outputs = {{"--out", o.out}};
    if (!o.lse.empty()) outputs.push_back({"--lse", o.lse});
    if (backward) outputs.insert(outputs.end(), {{"--dq", o.dq}, {"--dk", o.dk}, {"--dv", o.dv}});
    return outputs;
}

int run(const RunOptions& o) {
    const bool backward = wants_backward(o);
    // An output that names an input or another output, or cannot be written, is found before
    // anything is read or computed.
    const std::vector<FileArgument> inputs = input_files(o, backward);
    check_outputs(inputs, output_files(o, backward));
    const Backend& backend = find_backend(o.backend);
    if (backward) require_backward(backend);
    const DType dtype = parse_dtype(o.dtype);
    if (!backend.supports(dtype))
        throw std::invalid_argument("dtype = " + o.dtype + ": backend " + backend.name +
                                    " does not support it");

    const npy::Array q = npy::load_float32(o.q, "--q");
    const npy::Array k = npy::load_float32(o.k, "--k");
    const npy::Array v = npy::load_float32(o.v, "--v");
    // Each array's own rank first, so that the message blames the array that is wrong.
    AttentionProblem p;
    std::int64_t Bk = 0, dk = 0;
    read_shape(q, "--q", p.batch, p.heads, p.seq_q, p.dim);
    read_shape(k, "--k", Bk, p.heads_kv, p.seq_kv, dk);
    if (k.shape.size() != q.shape.size())
        throw std::invalid_argument("--k shape " + shape_str(k.shape) + ": must have the rank of Q " +
                                    shape_str(q.shape) + ", (B, H, N, d) or (N, d) for both");
    if (v.shape != k.shape)
        throw std::invalid_argument("--v shape " + shape_str(v.shape) +
                                    ": must equal the shape of K " + shape_str(k.shape));
    if (Bk != p.batch)
        throw std::invalid_argument("batch of K/V = " + std::to_string(Bk) +
                                    ": must equal batch of Q = " + std::to_string(p.batch));
    if (dk != p.dim)
        throw std::invalid_argument("head dim of K/V = " + std::to_string(dk) +
                                    ": must equal head dim of Q = " + std::to_string(p.dim));
    if (o.scale) p.scale = parse_float32("--scale", *o.scale);
    p.causal = o.causal;
    const BlockSizes mask_blocks =
        apply_tile_options(o.tiles, o.block_mask.empty() ? "" : "--block-mask", p);
    npy::Array mask;
    if (!o.block_mask.empty()) {
        mask = npy::load(o.block_mask);
        if (mask.type == npy::ElementType::float32)
            throw std::invalid_argument("--block-mask " + o.block_mask + ": must be uint8 or bool");
        const std::int64_t Tr = tile_count(p.seq_q, mask_blocks.Br),
                           Tc = tile_count(p.seq_kv, mask_blocks.Bc);
        if (mask.shape != std::vector<std::int64_t>{Tr, Tc})
            throw std::invalid_argument("--block-mask shape " + shape_str(mask.shape) +
                                        ": must be (Tr, Tc) = (" + std::to_string(Tr) + ", " +
                                        std::to_string(Tc) + ") for these block sizes");
        for (std::uint8_t b : mask.bytes)
            if (b > 1)
                throw std::invalid_argument("--block-mask " + o.block_mask +
                                            ": entries must be 0 or 1, found " + std::to_string(b));
        p.block_mask = {mask.bytes.data(), mask_blocks.Br, mask_blocks.Bc};
    }
    validate(p);
    // dO is read and checked before the forward runs, so that a bad dO costs no computation.
    npy::Array dO;
    if (backward) {
        dO = npy::load_float32(o.dout, "--dout");
        if (dO.shape != q.shape)
            throw std::invalid_argument("--dout shape " + shape_str(dO.shape) +
                                        ": must equal the shape of Q " + shape_str(q.shape) +
                                        " (dO = dLoss/dO has the shape of O)");
    }

    std::vector<float> O(static_cast<std::size_t>(p.q_elements()));
    std::vector<float> lse(static_cast<std::size_t>(p.lse_elements()));
    auto prepared = backend.prepare(p, q.floats.data(), k.floats.data(), v.floats.data(), dtype);
    prepared->execute();
    prepared->fetch(O.data(), lse.data());

    // The backward on this forward's O and LSE, in the same dtype. dK and dV have K's shape.
    std::vector<float> dQ, dK, dV;
    if (backward) {
        dQ.resize(static_cast<std::size_t>(p.q_elements()));
        dK.resize(static_cast<std::size_t>(p.kv_elements()));
        dV.resize(static_cast<std::size_t>(p.kv_elements()));
        const BackwardInputs in{q.floats.data(), k.floats.data(), v.floats.data(),
                                O.data(),        lse.data(),      dO.floats.data()};
        run_backward(backend, p, in, dQ.data(), dK.data(), dV.data(), dtype);
    }

    AtomicWriter writer(inputs);
    std::vector<std::int64_t> lse_shape = q.shape;
    lse_shape.pop_back();
    writer.add({"--out", o.out}, npy::serialize_float32(q.shape, O.data()));
    if (!o.lse.empty())
        writer.add({"--lse", o.lse}, npy::serialize_float32(lse_shape, lse.data()));
    if (backward) {
        writer.add({"--dq", o.dq}, npy::serialize_float32(q.shape, dQ.data()));
        writer.add({"--dk", o.dk}, npy::serialize_float32(k.shape, dK.data()));
        writer.add({"--dv", o.dv}, npy::serialize_float32(v.shape, dV.data()));
    }
    writer.commit();

    // Said only after success, so that a failure's stderr starts with "error:".
    const std::string tiles = prepared->tiles();
    std::cerr << backend.name << ": "
              << (tiles.empty() ? "no tiles (S and P materialized, Algorithm 0)" : "tiles " + tiles)
              << "\n";
    if (prepared->kv_splits() > 1)
        std::cerr << backend.name << ": split-KV, " << prepared->kv_splits()
                  << " key chunks merged\n";
    if (backward) std::cerr << backend.name << ": backward done (dQ, dK, dV written)\n";
    return 0;
}

}  // namespace

Command add_run_command(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "run", "Run one backend on Q, K, V .npy files and write O (and LSE) as .npy; with\n"
               "--dout/--dq/--dk/--dv, also the backward pass and its gradients dQ, dK, dV.\n"
               "Inputs: float32, C order, (B, H, N, d) or (N, d); K and V may have fewer heads\n"
               "than Q (MQA/GQA). Outputs are written only when everything succeeded.");
    auto o = std::make_shared<RunOptions>();
    cmd->add_option("--backend", o->backend, "Backend name (see `flashattn backends`)")->required();
    cmd->add_option("--q", o->q, "Query .npy, float32 (B, H, N_q, d) or (N_q, d)")->required();
    cmd->add_option("--k", o->k, "Key .npy, float32 (B, H_kv, N_kv, d) or (N_kv, d)")->required();
    cmd->add_option("--v", o->v, "Value .npy, same shape as --k")->required();
    cmd->add_option("--out", o->out,
                    "Output O .npy (float32, shape of Q). Each output replaces its file whole\n"
                    "(keeping its permissions; a symbolic link is written through) and is\n"
                    "refused when it is an input or another output")
        ->required();
    cmd->add_option("--lse", o->lse, "Also write the log-sum-exp of each row (B, H, N_q), natural log");
    cmd->add_option("--scale", o->scale, "Softmax scale (default 1/sqrt(d)), a finite float32");
    cmd->add_flag("--causal", o->causal,
                  "Causal mask, bottom-right aligned: row i attends key j iff j <= i + N_kv - N_q");
    add_tile_options(cmd, o->tiles);
    cmd->add_option("--block-mask", o->block_mask,
                    "Block-sparse mask (Algorithm 5): (Tr, Tc) uint8/bool .npy of 0/1 over blocks of\n"
                    "--mask-block-q x --mask-block-kv; 0 blocks are skipped");
    cmd->add_option("--dtype", o->dtype, "Precision the backend computes in: f32, f16 or bf16 "
                                         "(inputs are rounded to it; outputs stay float32)")
        ->check(CLI::IsMember({"f32", "f16", "bf16"}));
    cmd->add_option("--dout", o->dout,
                    "Backward pass: dLoss/dO .npy, float32, shape of Q. With --dq, --dk, --dv\n"
                    "(all four or none), on a backend that has a backward (`backends --verbose`)");
    cmd->add_option("--dq", o->dq, "Backward pass: output dQ .npy (float32, shape of Q)");
    cmd->add_option("--dk", o->dk, "Backward pass: output dK .npy (float32, shape of K)");
    cmd->add_option("--dv", o->dv, "Backward pass: output dV .npy (float32, shape of V)");
    return {cmd, [o] { return run(*o); }};
}

}  // namespace flashattn::cli
