// cuda/host/workspace.hpp — the device entries' working memory (common/backend.hpp, DeviceForward):
// one caller-owned block, cut into 256-byte aligned sub-buffers.
//
// A backend writes the cut once, as a function of the problem taking a WorkspaceCarver, and runs
// it twice: on a carver without memory, which only counts (what Backend::device_workspace_bytes
// reports), and on the caller's block (what the entry uses). So the two cannot disagree:
//
//   Parts cut(const AttentionProblem& p, WorkspaceCarver& w) { return {w.take<float>(n), ...}; }
//   bytes:  WorkspaceCarver counter;  cut(p, counter);  counter.bytes()
//   entry:  WorkspaceCarver w(a.workspace, a.workspace_bytes, "cuda-fa2");
//           Parts parts = cut(p, w);  w.require_fits();   // before anything is queued
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace flashattn::cuda {

class WorkspaceCarver {
public:
    static constexpr std::size_t kAlignment = 256;

    // Counting only: take() returns nullptr and adds up the bytes.
    WorkspaceCarver() = default;
    // The caller's block of `bytes` bytes at `base`; `who` names the backend in errors. Throws
    // std::invalid_argument for a base that is not 256-byte aligned.
    WorkspaceCarver(void* base, std::size_t bytes, std::string who)
        : base_(static_cast<char*>(base)), capacity_(bytes), who_(std::move(who)), carving_(true) {
        const auto address = reinterpret_cast<std::uintptr_t>(base);
        if (address % kAlignment != 0)
            throw std::invalid_argument("workspace = " + std::to_string(address) + ": " + who_ +
                                        " needs it 256-byte aligned");
    }

    // The next `count` elements of T, 256-byte aligned (nullptr when counting or count = 0).
    // Not to be used before require_fits() has passed.
    template <class T>
    T* take(std::size_t count) {
        const std::size_t offset = used_;
        used_ += (count * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
        return carving_ && count > 0 ? reinterpret_cast<T*>(base_ + offset) : nullptr;
    }

    // Throws std::invalid_argument naming both sizes when the caller's block is smaller than
    // what was taken.
    void require_fits() const {
        if (carving_ && used_ > capacity_)
            throw std::invalid_argument("workspace_bytes = " + std::to_string(capacity_) + ": " +
                                        who_ + " needs at least " + std::to_string(used_) +
                                        " bytes here (Backend::device_workspace_bytes)");
    }

    std::size_t bytes() const { return used_; }

private:
    char* base_ = nullptr;
    std::size_t capacity_ = 0;
    std::string who_;
    bool carving_ = false;
    std::size_t used_ = 0;
};

}  // namespace flashattn::cuda
