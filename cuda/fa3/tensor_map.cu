// cuda/fa3/tensor_map.cu — see cuda/fa3/tensor_map.hpp.
#include "cuda/fa3/tensor_map.hpp"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda/host/check.hpp"

namespace flashattn::fa3 {
namespace {

// cuTensorMapEncodeTiled is a driver function; the runtime hands out its address, so the library
// needs no link to libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
        FA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                       cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || fn == nullptr)
            throw std::runtime_error(
                "cuda-fa3: the CUDA driver has no cuTensorMapEncodeTiled (TMA needs 12.0 or newer)");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    return encode;
}

// A 4-D map (innermost first: d, rows, heads, batch) with boxes of box_cols x box_rows of one
// head, in the 128-byte swizzle (box_cols x elem_bytes = 128).
CUtensorMap encode_4d(const void* base, CUtensorMapDataType type, std::int64_t elem_bytes,
                      std::int64_t batch, std::int64_t heads, std::int64_t rows, std::int64_t d,
                      const ArrayLayout& layout, int box_cols, int box_rows) {
    CUtensorMap map;
    const cuuint64_t size[4] = {cuuint64_t(d), cuuint64_t(rows), cuuint64_t(heads),
                                cuuint64_t(batch)};
    const cuuint64_t stride_bytes[3] = {cuuint64_t(layout.row * elem_bytes),
                                        cuuint64_t(layout.head * elem_bytes),
                                        cuuint64_t(layout.batch * elem_bytes)};
    const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
    const cuuint32_t step[4] = {1, 1, 1, 1};
    const CUresult status = tensor_map_encoder()(
        &map, type, 4, const_cast<void*>(base), size, stride_bytes, box, step,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (status != CUDA_SUCCESS)
        throw std::runtime_error("cuda-fa3: cuTensorMapEncodeTiled failed (CUresult " +
                                 std::to_string(int(status)) + ")");
    return map;
}

}  // namespace

CUtensorMap tile_map(const void* base, DType dtype, std::int64_t batch, std::int64_t heads,
                     std::int64_t rows, std::int64_t d, const ArrayLayout& layout, int box_rows) {
    return encode_4d(base,
                     dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                     2, batch, heads, rows, d, layout, 64, box_rows);
}

CUtensorMap sum_map(float* base, std::int64_t batch, std::int64_t heads, std::int64_t rows,
                    std::int64_t d, int box_rows) {
    return encode_4d(base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, batch, heads, rows, d,
                     ArrayLayout::contiguous(heads, rows, d), 32, box_rows);
}

bool tma_aligned(const void* array) {
    return reinterpret_cast<std::uintptr_t>(array) % 16 == 0;
}

bool tma_layout(const ArrayLayout& layout) {
    for (const std::int64_t stride : {layout.batch, layout.head, layout.row})
        if (stride <= 0 || stride % 8 != 0) return false;
    return true;
}

void require_tma_aligned(const void* array, const char* name) {
    const auto address = reinterpret_cast<std::uintptr_t>(array);
    if (!tma_aligned(array))
        throw std::invalid_argument(std::string(name) + " = " + std::to_string(address) +
                                    ": cuda-fa3 reads it with TMA, which needs a 16-byte aligned "
                                    "address");
}

void require_tma_layout(const ArrayLayout& layout, const char* name) {
    if (!tma_layout(layout))
        throw std::invalid_argument(
            std::string(name) + " has strides (" + std::to_string(layout.batch) + ", " +
            std::to_string(layout.head) + ", " + std::to_string(layout.row) +
            ") elements for its batch, head and row axes: cuda-fa3 reads it with TMA, which "
            "needs each to be a positive multiple of 8 (16 bytes)");
}

}  // namespace flashattn::fa3
