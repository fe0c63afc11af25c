// A CUDA execution model on the CPU, for running the flash-attention kernels without a GPU.
//
// cpu_emulator.py turns a .cu file into C++ that includes this header: every inline-PTX
// `asm(...)` statement becomes `emu::ptx("template", {operands})`, and `extern __shared__`
// arrays become a pointer to the block's dynamic shared memory.  What runs is the
// kernel's own code; only the hardware is modelled here:
//
//   threads   each CUDA thread of a block is a fiber (ucontext) with its own stack; blocks
//             run one after another.  A fiber runs until it reaches a barrier, then the
//             scheduler resumes another, by a schedule chosen per launch (`order`, see
//             run_block): a kernel that reads shared memory another warp writes without
//             __syncthreads gives different results under different schedules.
//   barriers  __syncthreads waits for every thread of the block; warp-wide instructions
//             (mma.sync, ldmatrix, shfl.sync) wait for the 32 lanes of the warp, check that
//             all of them execute the same instruction, then each lane computes its own
//             result from the 32 lanes' operands.  A barrier some thread never reaches
//             stops the launch with a message (on a GPU: a hang or undefined behaviour).
//   PTX       mma.sync.m16n8k16 (f16 x f16 + f32), ldmatrix.x4(.trans), cvt to f16/f16x2,
//             cvta.to.shared: fragment layouts as in the PTX ISA, products exact in fp32
//             accumulation.  An instruction not listed stops the launch.
//   memory    global buffers and the dynamic shared memory are heap blocks of exactly the
//             launch's sizes (so AddressSanitizer catches any access outside them);
//             shared memory starts filled with 0xff bytes (NaN), so reading what no thread
//             wrote shows up in the results.  atomicAdd is a plain add: fibers never run
//             at the same time.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// The emulator's own code is not what the sanitizers are there to check.
#define EMU_UNCHECKED __attribute__((no_sanitize("address", "undefined")))

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace emu {

[[noreturn]] inline void fail(const std::string& why) {
    fprintf(stderr, "cpu_emulator: %s\n", why.c_str());
    exit(3);
}

enum State { READY, AT_BLOCK_BARRIER, AT_WARP_BARRIER, FINISHED };
constexpr size_t STACK_BYTES = 256 * 1024;
constexpr int MAX_DEPOSIT = 64;  // bytes one lane hands to a warp-wide instruction

struct Fiber {
    ucontext_t context;
    std::unique_ptr<char[]> stack{new char[STACK_BYTES]};  // not zeroed: 32 MiB for 128 threads
    dim3 index;
    int linear = 0;
    State state = READY;
    unsigned warp_calls = 0;  // warp-wide instructions this thread has executed
};

struct Deposit { std::string op; unsigned char bytes[MAX_DEPOSIT]; };

struct Launch {
    dim3 grid, block, block_index;
    std::vector<Fiber> fibers;
    std::vector<Deposit> deposits;  // [2 parities][threads]: double-buffered per warp call
    ucontext_t scheduler;
    Fiber* current = nullptr;
    unsigned char* shared = nullptr;
    size_t shared_bytes = 0;
    void (*body)(void**) = nullptr;
    void** args = nullptr;
    std::vector<unsigned> warp_serial;  // per warp: bumped at each release of its barrier
};
inline Launch the_launch;

inline Fiber& me() { return *the_launch.current; }
inline void* dynamic_shared() { return the_launch.shared; }

inline void yield_as(State state) {
    Fiber& f = me();
    f.state = state;
    swapcontext(&f.context, &the_launch.scheduler);
}

inline void sync_block() { yield_as(AT_BLOCK_BARRIER); }

// Hand `bytes` of this lane's operands to the warp and wait for all 32 lanes; returns the
// deposits of lanes 0..31 (stride sizeof(Deposit)), checked to come from the same `op`.
EMU_UNCHECKED inline const Deposit* warp_exchange(const char* op, const void* mine, size_t bytes) {
    Fiber& f = me();
    const int threads = (int)the_launch.fibers.size();
    if (threads % 32 != 0) fail(std::string(op) + ": the block is not a whole number of warps");
    const int warp0 = f.linear / 32 * 32, parity = f.warp_calls++ & 1;
    Deposit* slots = &the_launch.deposits[parity * threads + warp0];
    slots[f.linear - warp0].op = op;
    memcpy(slots[f.linear - warp0].bytes, mine, bytes);
    yield_as(AT_WARP_BARRIER);
    for (int lane = 0; lane < 32; ++lane)
        if (slots[lane].op != op)
            fail("warp " + std::to_string(warp0 / 32) + ": lane " + std::to_string(lane) + " executes '" +
                 slots[lane].op + "' while lane " + std::to_string(f.linear - warp0) + " executes '" + op + "'");
    return slots;
}

inline int lane_id() { return me().linear % 32; }

template <class T>
T shfl_xor(unsigned mask, T value, int lane_mask) {
    static_assert(sizeof(T) <= MAX_DEPOSIT, "value too large");
    if (mask != 0xffffffffu) fail("__shfl_xor_sync: only the full-warp mask is modelled");
    const Deposit* lanes = warp_exchange("shfl.sync.bfly", &value, sizeof(T));
    T other;
    memcpy(&other, lanes[(lane_id() ^ lane_mask) & 31].bytes, sizeof(T));
    return other;
}

template <class T>
T atomic_add(T* address, T value) {
    T old = *address;
    *address = old + value;
    return old;
}

// ---- the scheduler ------------------------------------------------------------------

inline void fiber_entry() {
    the_launch.body(the_launch.args);
    me().state = FINISHED;
    swapcontext(&me().context, &the_launch.scheduler);
}

// Release the block barrier when every thread is at it, and warp w's barrier when its
// 32 lanes are.  Returns whether anything was released.
inline bool release_block() {
    for (Fiber& f : the_launch.fibers) if (f.state != AT_BLOCK_BARRIER) return false;
    for (Fiber& f : the_launch.fibers) f.state = READY;
    return true;
}

inline bool release_warp(size_t w) {
    std::vector<Fiber>& fs = the_launch.fibers;
    if (32 * w + 32 > fs.size()) return false;
    for (size_t l = 32 * w; l < 32 * w + 32; ++l) if (fs[l].state != AT_WARP_BARRIER) return false;
    for (size_t l = 32 * w; l < 32 * w + 32; ++l) fs[l].state = READY;
    ++the_launch.warp_serial[w];
    return true;
}

inline void resume(Fiber& f) {
    the_launch.current = &f;
    swapcontext(&the_launch.scheduler, &f.context);
}

// "0-4, 6, 9-31": the threads of this block in `state`, as ranges.
inline std::string threads_in(State state) {
    std::string list;
    const std::vector<Fiber>& fs = the_launch.fibers;
    for (size_t i = 0; i < fs.size(); ++i) {
        if (fs[i].state != state || (i > 0 && fs[i - 1].state == state)) continue;
        size_t j = i;
        while (j + 1 < fs.size() && fs[j + 1].state == state) ++j;
        list += (list.empty() ? "" : ", ") + std::to_string(i) + (j > i ? "-" + std::to_string(j) : "");
    }
    return list.empty() ? "none" : list;
}

[[noreturn]] inline void deadlock() {
    const dim3 b = the_launch.block_index;
    fail("deadlock in block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) +
         "): a barrier that not every thread reaches.\n  at __syncthreads: threads " + threads_in(AT_BLOCK_BARRIER) +
         "\n  at a warp-wide instruction: threads " + threads_in(AT_WARP_BARRIER) +
         "\n  finished: threads " + threads_in(FINISHED));
}

// Schedules, by `order`:
//   0  lockstep: every thread runs to its next barrier, in thread order, before any
//      barrier is released (all warps advance together: the kindest schedule);
//   1  greedy: always resume the highest-numbered ready thread, so the last warp runs
//      ahead to the next __syncthreads before warp 0 starts;
//   2+ random: resume a ready thread drawn at random (seeded by `order`).
EMU_UNCHECKED inline void run_block(unsigned order) {
    std::vector<Fiber>& fs = the_launch.fibers;
    const int threads = (int)fs.size();
    memset(the_launch.shared, 0xff, the_launch.shared_bytes);
    for (Fiber& f : fs) {
        f.state = READY;
        f.warp_calls = 0;
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.get();
        f.context.uc_stack.ss_size = STACK_BYTES;
        f.context.uc_link = nullptr;
        makecontext(&f.context, fiber_entry, 0);
    }
    unsigned long long rng = order * 0x9e3779b97f4a7c15ull + 1;
    std::vector<int> ready;
    for (;;) {
        if (order == 0) {
            bool ran = false;
            for (Fiber& f : fs) if (f.state == READY) { resume(f); ran = true; }
            if (ran) continue;
            for (size_t w = 0; 32 * w < fs.size(); ++w) ran |= release_warp(w);
            if (ran || release_block()) continue;
        } else {
            ready.clear();
            for (int i = threads - 1; i >= 0; --i) if (fs[i].state == READY) ready.push_back(i);
            if (!ready.empty()) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                Fiber& f = fs[ready[order == 1 ? 0 : (rng >> 33) % ready.size()]];
                resume(f);
                release_warp(f.linear / 32);
                continue;
            }
            if (release_block()) continue;
        }
        bool done = true;
        for (Fiber& f : fs) done &= f.state == FINISHED;
        if (done) return;
        deadlock();
    }
}

inline void launch_kernel(void (*body)(void**), void** args, dim3 grid, dim3 block, size_t shared_bytes, unsigned order) {
    Launch& L = the_launch;
    const int threads = (int)(block.x * block.y * block.z);
    if (threads < 1 || threads > 1024) fail("block size " + std::to_string(threads) + " is outside 1..1024");
    if (shared_bytes > 227 * 1024) fail("dynamic shared memory " + std::to_string(shared_bytes) + " > 227 KiB");
    L.grid = grid; L.block = block; L.body = body; L.args = args; L.shared_bytes = shared_bytes;
    L.shared = (unsigned char*)malloc(shared_bytes ? shared_bytes : 1);
    L.fibers = std::vector<Fiber>(threads);
    L.deposits = std::vector<Deposit>(2 * threads);
    L.warp_serial = std::vector<unsigned>((threads + 31) / 32);
    for (int i = 0; i < threads; ++i) {
        L.fibers[i].linear = i;
        L.fibers[i].index = dim3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
    }
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                L.block_index = dim3{x, y, z};
                run_block(order);
            }
    free(L.shared);
    L.fibers.clear();
}

}  // namespace emu

#define threadIdx (emu::me().index)
#define blockIdx (emu::the_launch.block_index)
#define blockDim (emu::the_launch.block)
#define gridDim (emu::the_launch.grid)
#define __syncthreads() emu::sync_block()
#define __shfl_xor_sync(mask, value, lane_mask) emu::shfl_xor(mask, value, lane_mask)
#define atomicAdd(address, value) emu::atomic_add(address, value)

#include "cpu_emulator_ptx.h"
