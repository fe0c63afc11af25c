// CUDA threads on the CPU (see emulator.h): one fiber per thread, barriers, schedules.
//
// A fiber runs until it reaches a barrier — __syncthreads or a warp-wide instruction —
// then the scheduler resumes another.  Blocks run one after another, each with fresh
// stacks and fresh shared memory.  Under ThreadSanitizer (the "race" build) every fiber
// is a TSan fiber and the only happens-before edges are the ones CUDA guarantees:
// __syncthreads orders the threads of a block, nothing orders two blocks, and warp-wide
// instructions exchange registers, not memory (only __syncwarp would order memory).  So
// a conflicting pair of plain accesses that CUDA does not order is reported whatever the
// schedule: a missing __syncthreads, or `+=` where atomicAdd is needed.
#pragma once
#include <ucontext.h>

#if defined(__SANITIZE_THREAD__)
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_acquire(void* address);
void __tsan_release(void* address);
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
}
#define EMU_RACE(...) __VA_ARGS__
#else
#define EMU_RACE(...)
#endif

namespace emu {

enum State { READY, AT_BLOCK_BARRIER, AT_WARP_BARRIER, FINISHED };
enum Schedule { LOCKSTEP, GREEDY, SHUFFLED };
constexpr size_t STACK_BYTES = 256 * 1024;
constexpr int MAX_DEPOSIT = 64;  // bytes one lane hands to a warp-wide instruction

// One cp.async of this thread not yet waited for: `bytes` from src, zeros up to 16.
struct AsyncCopy { size_t shared_offset; const unsigned char* src; unsigned bytes; };

struct Fiber {
    ucontext_t context;
    char* stack = nullptr;
    void* race_fiber = nullptr;  // its TSan fiber, in the race build
    bool started = false;
    dim3 index;
    int linear = 0;
    State state = READY;
    unsigned warp_calls = 0;     // warp-wide instructions this thread has executed
    unsigned block_barriers = 0;
    std::vector<AsyncCopy> async_open;                 // cp.async issued since the last commit
    std::vector<std::vector<AsyncCopy>> async_groups;  // committed groups, oldest first
};

struct Deposit { std::string op; unsigned char bytes[MAX_DEPOSIT]; };

struct Launch {
    dim3 grid, block, block_index;
    Schedule schedule = LOCKSTEP;
    unsigned seed = 0, fill = 0xff;
    std::vector<Fiber> fibers;
    std::vector<Deposit> deposits;      // [2 parities][threads]: double-buffered per warp call
    std::vector<unsigned> warp_serial;  // per warp: bumped at each release (names one exchange)
    std::vector<int> warp_priority;     // SHUFFLED: the order warps run in until the next __syncthreads
    char barrier_tokens[2];             // TSan sync objects of even and odd __syncthreads
    ucontext_t scheduler;
    void* scheduler_race_fiber = nullptr;
    Fiber* current = nullptr;
    unsigned char* shared = nullptr;
    size_t shared_bytes = 0;
    void (*body)(void**) = nullptr;
    void** args = nullptr;
};
inline Launch the_launch;

EMU_UNCHECKED inline Fiber& me() { return *the_launch.current; }
EMU_UNCHECKED inline void* dynamic_shared() { return the_launch.shared; }
EMU_UNCHECKED inline int lane_id() { return me().linear % 32; }

EMU_UNCHECKED inline void yield_as(State state) {
    Fiber& f = me();
    f.state = state;
    EMU_RACE(__tsan_switch_to_fiber(the_launch.scheduler_race_fiber, 1 /* no sync */));
    swapcontext(&f.context, &the_launch.scheduler);
}

// __syncthreads: what a thread did before it happens-before what any thread does after.
EMU_UNCHECKED inline void sync_block() {
    EMU_RACE(char* token = &the_launch.barrier_tokens[me().block_barriers++ & 1]; __tsan_release(token));
    yield_as(AT_BLOCK_BARRIER);
    EMU_RACE(__tsan_acquire(token));
}

// Hand `bytes` of this lane's operands to the warp and wait for all 32 lanes; returns the
// deposits of lanes 0..31, checked to come from the same instruction `op`.
EMU_UNCHECKED inline const Deposit* warp_exchange(const char* op, const void* mine, size_t bytes) {
    EMU_RACE(__tsan_ignore_thread_begin());  // the emulator's bookkeeping, not the kernel's memory
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
    EMU_RACE(__tsan_ignore_thread_end());
    return slots;
}

// ---- the scheduler ------------------------------------------------------------------

EMU_UNCHECKED inline void fiber_entry() {
    the_launch.body(the_launch.args);
    me().state = FINISHED;
    EMU_RACE(__tsan_switch_to_fiber(the_launch.scheduler_race_fiber, 1));
    swapcontext(&me().context, &the_launch.scheduler);
}

// A thread's first resumption carries what the host did before the launch (the inputs);
// later ones carry nothing, so only barriers order threads.
EMU_UNCHECKED inline void resume(Fiber& f) {
    the_launch.current = &f;
    EMU_RACE(__tsan_switch_to_fiber(f.race_fiber, f.started ? 1 : 0));
    f.started = true;
    swapcontext(&the_launch.scheduler, &f.context);
}

EMU_UNCHECKED inline unsigned random_next(unsigned long long& state) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)(state >> 33);
}

EMU_UNCHECKED inline bool release_block() {
    for (Fiber& f : the_launch.fibers) if (f.state != AT_BLOCK_BARRIER) return false;
    for (Fiber& f : the_launch.fibers) f.state = READY;
    return true;
}

EMU_UNCHECKED inline bool release_warp(size_t w) {
    std::vector<Fiber>& fs = the_launch.fibers;
    if (32 * w + 32 > fs.size()) return false;
    for (size_t l = 32 * w; l < 32 * w + 32; ++l) if (fs[l].state != AT_WARP_BARRIER) return false;
    for (size_t l = 32 * w; l < 32 * w + 32; ++l) fs[l].state = READY;
    ++the_launch.warp_serial[w];
    return true;
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

// The next thread to resume, or null when every thread waits at a barrier.
//   LOCKSTEP  threads in order, each to its next barrier, before any barrier is released:
//             all warps advance together (the kindest schedule);
//   GREEDY    the highest-numbered ready thread: the last warp runs ahead to the next
//             __syncthreads before warp 0 starts;
//   SHUFFLED  the same, with the warps' order drawn afresh at every __syncthreads.
EMU_UNCHECKED inline Fiber* next_ready(bool& lockstep_sweep_done) {
    std::vector<Fiber>& fs = the_launch.fibers;
    if (the_launch.schedule == LOCKSTEP) {
        for (Fiber& f : fs) if (f.state == READY) return &f;
        lockstep_sweep_done = true;
        return nullptr;
    }
    for (int w : the_launch.warp_priority)
        for (int l = 32 * w + 31; l >= 32 * w; --l)
            if (l < (int)fs.size() && fs[l].state == READY) return &fs[l];
    return nullptr;
}

EMU_UNCHECKED inline void set_warp_priority(unsigned long long& rng) {
    std::vector<int>& order = the_launch.warp_priority;
    const int warps = (int)(the_launch.fibers.size() + 31) / 32;
    order.resize(warps);
    for (int w = 0; w < warps; ++w) order[w] = warps - 1 - w;  // GREEDY: last warp first
    if (the_launch.schedule == SHUFFLED)
        for (int i = warps - 1; i > 0; --i) std::swap(order[i], order[random_next(rng) % (i + 1)]);
}

// Setup and teardown are hidden from TSan (ignored allocations reset its shadow memory), so
// nothing a block did is ordered before the next block: two blocks never synchronise.
EMU_UNCHECKED inline void run_block() {
    Launch& L = the_launch;
    EMU_RACE(__tsan_ignore_thread_begin());
    L.shared = (unsigned char*)malloc(L.shared_bytes ? L.shared_bytes : 1);  // fresh: no history
    memset(L.shared, (int)L.fill, L.shared_bytes);  // 0xff: NaN, so unwritten memory shows up
    for (Fiber& f : L.fibers) {
        f.state = READY;
        f.started = false;
        f.warp_calls = f.block_barriers = 0;
        f.async_open.clear();
        f.async_groups.clear();
        f.stack = (char*)malloc(STACK_BYTES);
        EMU_RACE(f.race_fiber = __tsan_create_fiber(0));
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack;
        f.context.uc_stack.ss_size = STACK_BYTES;
        f.context.uc_link = nullptr;
        makecontext(&f.context, fiber_entry, 0);
    }
    EMU_RACE(__tsan_ignore_thread_end());
    unsigned long long rng = L.seed * 0x9e3779b97f4a7c15ull + L.block_index.x + 7919ull * L.block_index.y + 1;
    set_warp_priority(rng);
    for (;;) {
        bool sweep_done = false;
        if (Fiber* f = next_ready(sweep_done)) {
            resume(*f);
            if (L.schedule != LOCKSTEP) release_warp(f->linear / 32);
            continue;
        }
        bool released = false;
        if (L.schedule == LOCKSTEP)
            for (size_t w = 0; 32 * w < L.fibers.size(); ++w) released |= release_warp(w);
        if (released) continue;
        if (release_block()) { set_warp_priority(rng); continue; }
        bool done = true;
        for (Fiber& f : L.fibers) done &= f.state == FINISHED;
        if (!done) deadlock();
        break;
    }
    EMU_RACE(__tsan_ignore_thread_begin());
    for (Fiber& f : L.fibers) {
        EMU_RACE(__tsan_destroy_fiber(f.race_fiber));
        free(f.stack);
    }
    free(L.shared);
    EMU_RACE(__tsan_ignore_thread_end());
}

inline void launch_kernel(void (*body)(void**), void** args, dim3 grid, dim3 block, size_t shared_bytes) {
    Launch& L = the_launch;
    const unsigned threads = block.x * block.y * block.z;
    L.grid = grid; L.block = block; L.body = body; L.args = args; L.shared_bytes = shared_bytes;
    L.fibers = std::vector<Fiber>(threads);
    L.deposits = std::vector<Deposit>(2 * threads);
    L.warp_serial = std::vector<unsigned>((threads + 31) / 32);
    EMU_RACE(L.scheduler_race_fiber = __tsan_get_current_fiber());
    for (unsigned i = 0; i < threads; ++i) {
        L.fibers[i].linear = (int)i;
        L.fibers[i].index = dim3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
    }
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                L.block_index = dim3{x, y, z};
                run_block();
            }
    L.fibers.clear();
}

}  // namespace emu
