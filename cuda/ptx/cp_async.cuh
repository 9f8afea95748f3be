// cuda/ptx/cp_async.cuh — cp.async (sm_80+), the asynchronous global -> shared copy every
// mma.sync-era kernel streams its tiles with: one thin wrapper per instruction.
//
// A copy does not pass through registers, so the copy of the next tile runs while the threads
// compute on the current one (FlashAttention-2's K/V streaming). Copies are grouped: a thread
// commits the copies it issued as a group, and groups complete in order, so "wait until at most
// N groups are pending" waits for one particular tile. Its src-size operand zero-fills: with
// `valid` false nothing is read (so the source only needs to be some valid address) and zeros are
// written, which is how ragged tails and padding columns are filled.
#pragma once

namespace flashattn {

// Copies 16 bytes, or writes 16 zero bytes when !valid. Both addresses 16-byte aligned.
__device__ inline void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(valid ? 16 : 0));
}

// Copies 4 bytes (one float), or writes a zero when !valid.
__device__ inline void cp_async_4(void* smem_dst, const void* gmem_src, bool valid) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(valid ? 4 : 0));
}

// Closes the current group of this thread's copies.
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's committed groups are still in flight. A
// __syncthreads() must follow before other threads read what arrived.
template <int kPending>
__device__ inline void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Makes the mbarrier `bar` (in shared memory) count one arrival of this thread once every copy
// the thread has issued so far has landed; the thread goes on at once. `.noinc`: the arrival is
// one of those the barrier was initialized to expect. A thread that waits for the barrier's phase
// then sees the copies (cuda-fa3's backward producer: L_i and D_i into a ring slot).
__device__ inline void cp_async_mbarrier_arrive(void* bar) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(at) : "memory");
}

// Waits for every copy this thread issued (committed or not).
__device__ inline void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace flashattn
