// A CUDA execution model on the CPU, for running the flash-attention kernels without a GPU.
//
// source.py turns a .cu file into C++ that includes this header: every inline-PTX
// `asm(...)` statement becomes `emu::ptx("template", {operands})`, and `extern __shared__`
// arrays become a pointer to the block's dynamic shared memory.  What runs is the
// kernel's own code; only the hardware is modelled:
//
//   threads   one fiber per CUDA thread, blocks one after another, resumed by a schedule
//             chosen per launch (cuda_threads.h): lockstep, greedy (the last warp
//             runs ahead), or the warps shuffled at every __syncthreads.
//   barriers  __syncthreads waits for every thread of the block; warp-wide instructions
//             (mma.sync, ldmatrix, shfl.sync) wait for the 32 lanes of the warp, check that
//             all of them execute the same instruction, then each lane computes its own
//             result from the 32 lanes' operands.  A barrier some thread never reaches
//             stops the launch with a message (on a GPU: a hang or undefined behaviour).
//   PTX       mma.sync.m16n8k16 (f16 or bf16 inputs, f32 accumulators), ldmatrix.x4 (.trans),
//             cvt to f16/f16x2/bf16/bf16x2, cvta.to.shared, cp.async (16-byte .cg,
//             commit_group, wait_group; ptx.h): fragment layouts as in the PTX ISA.
//             An instruction not listed stops the launch.
//   memory    global buffers and each block's shared memory are heap blocks of exactly the
//             launch's sizes; shared memory starts filled with one byte value (0xff: NaN).
//   limits    __launch_bounds__, 1024 threads per block, grid.y and grid.z <= 65535,
//             48 KiB of dynamic shared memory unless the kernel opted in, at most
//             163 KiB (the sm_80 opt-in limit; sm_90 allows 227).
//
// Two builds check different things (__init__.py builds them): "memory" runs under AddressSanitizer
// and UBSan — an access outside a buffer or a misaligned vector access stops the run;
// "race" runs under ThreadSanitizer with CUDA's ordering rules — a missing __syncthreads or
// a plain `+=` where two blocks need atomicAdd is reported whatever the schedule.
// Not modelled: speed, the hardware's exp/log rounding and accumulation order inside a
// tensor core, __syncwarp and any warp-level memory ordering, divergent call sites of the
// same warp-wide instruction, accesses that land inside another live buffer.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// The emulator's own code is not what the sanitizers are there to check.
#define EMU_UNCHECKED __attribute__((no_sanitize("address", "undefined", "thread")))

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
template <class T> T min(T a, T b) { return a < b ? a : b; }  // both arguments of one type, as
template <class T> T max(T a, T b) { return a > b ? a : b; }  // a mixed call would be ambiguous

namespace emu {

[[noreturn]] inline void fail(const std::string& why) {
    fprintf(stderr, "emulator: %s\n", why.c_str());
    exit(3);
}

}  // namespace emu

#include "cuda_threads.h"

namespace emu {

template <class T>
T shfl_xor(unsigned mask, T value, int lane_mask) {
    static_assert(sizeof(T) <= MAX_DEPOSIT, "value too large");
    if (mask != 0xffffffffu) fail("__shfl_xor_sync: only the full-warp mask is modelled");
    EMU_RACE(__tsan_ignore_thread_begin());  // registers travel, not memory
    const Deposit* lanes = warp_exchange("shfl.sync.bfly", &value, sizeof(T));
    T other;
    memcpy(&other, lanes[(lane_id() ^ lane_mask) & 31].bytes, sizeof(T));
    EMU_RACE(__tsan_ignore_thread_end());
    return other;
}

// A relaxed atomic read-modify-write, as the GPU's: no ordering, but no lost updates.
template <class T>
T atomic_add(T* address, T value) {
    static_assert(sizeof(T) == 4, "32-bit atomics only");
    uint32_t* word = (uint32_t*)address;
    uint32_t seen = __atomic_load_n(word, __ATOMIC_RELAXED), sum;
    T old;
    do {
        memcpy(&old, &seen, 4);
        T updated = old + value;
        memcpy(&sum, &updated, 4);
    } while (!__atomic_compare_exchange_n(word, &seen, sum, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}

EMU_UNCHECKED inline dim3 thread_index() { return me().index; }
EMU_UNCHECKED inline dim3 block_index() { return the_launch.block_index; }
EMU_UNCHECKED inline dim3 block_dim() { return the_launch.block; }
EMU_UNCHECKED inline dim3 grid_dim() { return the_launch.grid; }

}  // namespace emu

#define threadIdx (emu::thread_index())
#define blockIdx (emu::block_index())
#define blockDim (emu::block_dim())
#define gridDim (emu::grid_dim())
#define __syncthreads() emu::sync_block()
#define __shfl_xor_sync(mask, value, lane_mask) emu::shfl_xor(mask, value, lane_mask)
#define atomicAdd(address, value) emu::atomic_add(address, value)
#define __launch_bounds__(...)  // source.py reads the bound from the source

#include "ptx.h"
