// cuda/tools/wgmma_probe.cu — checks, on a Hopper GPU, how wgmma reads its operands from shared
// memory: the two products of FlashAttention's inner loop with one warpgroup,
//   S = Q K^T   (A = Q, B = K, both "K-major": d contiguous), 64 x 64 x 64, fp16 -> fp32,
//   O = P V     (A = P from registers, B = V "MN-major": V's rows are keys, d contiguous),
// with Q, K, V stored as cuda-tc stores them (rows of 64 halves = 128 bytes, 16-byte chunk c of row
// r at chunk c ^ (r % 8): the 128-byte swizzle), for several candidate descriptor settings, and
// prints which ones give the right product. Not part of the build:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a cuda/tools/wgmma_probe.cu -o probe &&
//   ./probe
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr int N = 64;  // every matrix here is 64 x 64

// The shared-memory matrix descriptor of wgmma (PTX ISA, "Matrix Descriptor Format"): start
// address, leading- and stride-dimension byte offsets (all >> 4), and the swizzle mode in bits
// 62-63 (1 = 128-byte swizzle).
__device__ std::uint64_t descriptor(const void* smem, std::uint32_t lbo, std::uint32_t sbo) {
    const std::uint32_t addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
    std::uint64_t d = 0;
    d |= std::uint64_t((addr >> 4) & 0x3FFF);
    d |= std::uint64_t((lbo >> 4) & 0x3FFF) << 16;
    d |= std::uint64_t((sbo >> 4) & 0x3FFF) << 32;
    d |= std::uint64_t(1) << 62;
    return d;
}

__device__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

#define WG_D32                                                                                     \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D32_OUT(d)                                                                              \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),              \
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),              \
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d += A B, m64n64k16, A and B from shared memory, B K-major (trans-b 0).
__device__ void wgmma_ss(float (&d)[32], std::uint64_t a, std::uint64_t b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WG_D32
                 ", %32, %33, 1, 1, 1, 0, 0;\n"
                 : WG_D32_OUT(d)
                 : "l"(a), "l"(b));
}

// d += A B, m64n64k16, A from registers, B MN-major (trans-b 1).
__device__ void wgmma_rs_transb(float (&d)[32], const std::uint32_t (&a)[4], std::uint64_t b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WG_D32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : WG_D32_OUT(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ int swizzled(int r, int c) { return r * 8 + (c ^ (r & 7)); }  // 16-byte chunk index

// One warpgroup. X = Q (S test) or P (O test, row-major 64 x 64 halves in global), Y = K or V.
// mode 0: S = X Y^T with (lbo, sbo) for both operands, k advanced by `step` bytes per k16.
// mode 1: O = X Y with X from registers and Y MN-major, (lbo, sbo), `step` bytes per k16.
__global__ void probe(const __half* X, const __half* Y, float* out, int mode, int lbo, int sbo,
                      int step) {
    __shared__ __align__(1024) __half sX[N * N];
    __shared__ __align__(1024) __half sY[N * N];
    const int tid = threadIdx.x;
    for (int idx = tid; idx < N * 8; idx += 128) {  // 16-byte chunks, swizzled
        const int r = idx / 8, c = idx % 8;
        reinterpret_cast<uint4*>(sX)[swizzled(r, c)] = reinterpret_cast<const uint4*>(X)[idx];
        reinterpret_cast<uint4*>(sY)[swizzled(r, c)] = reinterpret_cast<const uint4*>(Y)[idx];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float d[32];
    for (int e = 0; e < 32; ++e) d[e] = 0.0f;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    wgmma_fence();
    for (int kk = 0; kk < N / 16; ++kk) {
        if (mode == 0) {
            wgmma_ss(d, descriptor(reinterpret_cast<const char*>(sX) + kk * step, lbo, sbo),
                     descriptor(reinterpret_cast<const char*>(sY) + kk * step, lbo, sbo));
        } else {
            // A fragment of rows 16 warp + (g, g + 8), k columns 16 kk + 2t (+1), + 8.
            std::uint32_t a[4];
            const int r0 = 16 * warp + g;
            const auto pair = [&](int r, int c) {
                return *reinterpret_cast<const std::uint32_t*>(X + r * N + c);
            };
            a[0] = pair(r0, 16 * kk + 2 * t), a[1] = pair(r0 + 8, 16 * kk + 2 * t);
            a[2] = pair(r0, 16 * kk + 8 + 2 * t), a[3] = pair(r0 + 8, 16 * kk + 8 + 2 * t);
            wgmma_rs_transb(d, a, descriptor(reinterpret_cast<const char*>(sY) + kk * step, lbo, sbo));
        }
    }
    wgmma_commit();
    wgmma_wait0();
    // D fragment: warp w rows 16 w + (g, g + 8); entry 4 i + e: column 8 i + 2t + e % 2.
    for (int i = 0; i < 8; ++i)
        for (int e = 0; e < 4; ++e)
            out[(16 * warp + g + 8 * (e / 2)) * N + 8 * i + 2 * t + e % 2] = d[4 * i + e];
}

}  // namespace

// With arguments MODE STEP LBO SBO: that one candidate only (a bad one may fault, which ends the
// process: cuda/tools/wgmma_probe.sh runs each in its own).
int main(int argc, char** argv) {
    const bool one = argc == 5;
    std::mt19937 gen(7);
    std::normal_distribution<float> dist;
    std::vector<__half> X(N * N), Y(N * N);
    std::vector<float> x(N * N), y(N * N);
    for (int e = 0; e < N * N; ++e) {
        X[e] = __float2half(dist(gen)), x[e] = __half2float(X[e]);
        Y[e] = __float2half(dist(gen)), y[e] = __half2float(Y[e]);
    }
    __half *dX, *dY;
    float* dOut;
    cudaMalloc(&dX, N * N * 2), cudaMalloc(&dY, N * N * 2), cudaMalloc(&dOut, N * N * 4);
    cudaMemcpy(dX, X.data(), N * N * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dY, Y.data(), N * N * 2, cudaMemcpyHostToDevice);
    std::vector<float> out(N * N);
    const int offsets[] = {0, 16, 128, 1024, 2048, 4096, 8192};
    for (int mode = 0; mode < 2; ++mode) {
        if (one && mode != std::atoi(argv[1])) continue;
        std::vector<double> ref(N * N, 0.0);
        for (int i = 0; i < N; ++i)
            for (int j = 0; j < N; ++j)
                for (int k = 0; k < N; ++k)
                    ref[i * N + j] += mode == 0 ? double(x[i * N + k]) * y[j * N + k]
                                                : double(x[i * N + k]) * y[k * N + j];
        const int steps[] = {32, 2048};
        for (int step : steps)
            for (int lbo : offsets)
                for (int sbo : offsets) {
                    if (one && (step != std::atoi(argv[2]) || lbo != std::atoi(argv[3]) ||
                                sbo != std::atoi(argv[4])))
                        continue;
                    cudaMemset(dOut, 0xFF, N * N * 4);
                    probe<<<1, 128>>>(dX, dY, dOut, mode, lbo, sbo, step);
                    if (cudaDeviceSynchronize() != cudaSuccess) {
                        std::printf("mode %d step %d lbo %d sbo %d: launch failed\n", mode, step,
                                    lbo, sbo);
                        return 1;
                    }
                    cudaMemcpy(out.data(), dOut, N * N * 4, cudaMemcpyDeviceToHost);
                    double err = 0;
                    for (int e = 0; e < N * N; ++e)
                        err = std::fmax(err, std::fabs(out[e] - ref[e]));
                    if (err < 1e-2 || one)
                        std::printf("%s: step %d bytes per k16, LBO %d, SBO %d: max error %.2e\n",
                                    mode == 0 ? "S = Q K^T (K-major A, B)" : "O = P V (MN-major B)",
                                    step, lbo, sbo, err);
                    if (err < 1e-2 || one) std::fflush(stdout);
                }
    }
    std::printf("probe done\n");
    return 0;
}
