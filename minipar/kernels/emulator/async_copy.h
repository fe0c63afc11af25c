// cp.async on the CPU emulator (see emulator.h), the asynchronous copy of sm_80:
//
//   cp.async.cg.shared.global [dst], [src], 16, n    16 bytes: n from src, zeros after
//   cp.async.commit_group                             this thread's copies so far form a group
//   cp.async.wait_group N                             until at most N groups are in flight
//
// On a GPU the 16 destination bytes are undefined from the issue until a wait that covers
// the copy.  So the emulator writes the launch's fill byte (0xff: NaN) there at the issue —
// a write ThreadSanitizer sees, so a copy issued while another warp still reads the
// buffer is a reported race — and the real bytes only at that wait: a read before it
// sees NaN.  Each thread keeps its own groups (cuda_threads.h, Fiber).
#pragma once

namespace emu {

// cp.async's data movement, outside the emulator's unchecked code: ASan checks the read
// of global memory, TSan sees the write of shared memory as this thread's.
__attribute__((noinline)) inline void copy_bytes(unsigned char* dst, const unsigned char* src, unsigned bytes,
                                                 unsigned fill_to, int fill) {
    for (unsigned i = 0; i < bytes; ++i) dst[i] = src[i];
    for (unsigned i = bytes; i < fill_to; ++i) dst[i] = (unsigned char)fill;
}

EMU_UNCHECKED inline void cp_async_issue(uint64_t shared_offset, uint64_t src, uint64_t copy_size, uint64_t bytes) {
    if (copy_size != 16) fail("cp.async: only 16-byte copies (.cg) are modelled");
    if (bytes > 16) fail("cp.async: source size " + std::to_string(bytes) + " exceeds the 16 bytes copied");
    if (shared_offset % 16 != 0 || shared_offset + 16 > the_launch.shared_bytes)
        fail("cp.async: shared address " + std::to_string(shared_offset) + " is not 16-byte aligned inside " +
             std::to_string(the_launch.shared_bytes) + " bytes of shared memory");
    if (src % 16 != 0) fail("cp.async: global address not 16-byte aligned");
    EMU_RACE(__tsan_ignore_thread_end());
    copy_bytes(the_launch.shared + shared_offset, nullptr, 0, 16, (int)the_launch.fill);  // undefined until the wait
    EMU_RACE(__tsan_ignore_thread_begin());
    me().async_open.push_back({shared_offset, (const unsigned char*)(uintptr_t)src, (unsigned)bytes});
}

EMU_UNCHECKED inline void cp_async_commit() {
    me().async_groups.push_back(std::move(me().async_open));
    me().async_open.clear();
}

// Complete this thread's committed groups until at most `pending` are outstanding.
EMU_UNCHECKED inline void cp_async_wait(uint64_t pending) {
    auto& groups = me().async_groups;
    while (groups.size() > pending) {
        for (const AsyncCopy& c : groups.front()) {
            EMU_RACE(__tsan_ignore_thread_end());
            copy_bytes(the_launch.shared + c.shared_offset, c.src, c.bytes, 16, 0);
            EMU_RACE(__tsan_ignore_thread_begin());
        }
        groups.erase(groups.begin());
    }
}

}  // namespace emu
