// main() of an emulated kernel program (see __init__.py): reads a launch file
//     kernel NAME | grid X Y Z | block X Y Z | shared BYTES | shared_limit BYTES
//     schedule lockstep|greedy|shuffled SEED | fill BYTE
//     arg pointer PATH BYTES | arg int32 VALUE | arg float32 BITS      (one line each, in order)
// loads each buffer into a heap block of exactly BYTES, checks the launch against the
// kernel's signature and the hardware's limits, launches, writes the buffers back.
#pragma once
#include <fstream>
#include <sstream>

namespace emu {

// A kernel of the program: its launcher, its parameters (p pointer, i int, f float) and
// its __launch_bounds__ (0: none).
struct Entry { const char* name; void (*run)(void**); const char* signature; unsigned max_threads; };
extern const Entry entries[];

constexpr size_t DEFAULT_SHARED_LIMIT = 48 * 1024, OPT_IN_SHARED_LIMIT = 163 * 1024;

struct Arg { char kind; std::string path; size_t bytes; void* pointer; int32_t i; uint32_t f; };

inline void check_launch(const Entry& entry, const std::vector<Arg>& args, dim3 grid, dim3 block,
                         size_t shared, size_t shared_limit) {
    const std::string name = entry.name;
    const unsigned threads = block.x * block.y * block.z;
    if (threads < 1 || threads > 1024) fail(name + ": " + std::to_string(threads) + " threads per block (1..1024)");
    if (entry.max_threads && threads > entry.max_threads)
        fail(name + ": " + std::to_string(threads) + " threads exceed __launch_bounds__(" + std::to_string(entry.max_threads) + ")");
    if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535)
        fail(name + ": grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) +
             ") outside the limits (y and z at most 65535)");
    if (shared > shared_limit)
        fail(name + ": " + std::to_string(shared) + " bytes of dynamic shared memory, but the kernel allows " +
             std::to_string(shared_limit) + " (above 48 KiB a kernel must opt in: max_dynamic_shared_size_bytes)");
    if (shared_limit > OPT_IN_SHARED_LIMIT) fail(name + ": shared memory limit above 163 KiB (sm_80's maximum)");
    if (strlen(entry.signature) != args.size())
        fail(name + ": " + std::to_string(args.size()) + " arguments for " + std::to_string(strlen(entry.signature)) + " parameters");
    for (size_t i = 0; i < args.size(); ++i)
        if (args[i].kind != entry.signature[i])
            fail(name + ": argument " + std::to_string(i) + " is '" + args[i].kind + "', the parameter is '" +
                 entry.signature[i] + "' (p pointer, i int32, f float32)");
}

inline int run_launch_file(const char* launch_path) {
    std::ifstream launch(launch_path);
    if (!launch) fail(std::string("cannot open ") + launch_path);
    std::string line, name, schedule = "lockstep";
    dim3 grid, block;
    size_t shared = 0, shared_limit = DEFAULT_SHARED_LIMIT;
    unsigned seed = 0, fill = 0xff;
    std::vector<Arg> args;
    while (std::getline(launch, line)) {
        std::istringstream in(line);
        std::string key, kind;
        in >> key;
        if (key == "kernel") in >> name;
        else if (key == "grid") in >> grid.x >> grid.y >> grid.z;
        else if (key == "block") in >> block.x >> block.y >> block.z;
        else if (key == "shared") in >> shared;
        else if (key == "shared_limit") in >> shared_limit;
        else if (key == "schedule") in >> schedule >> seed;
        else if (key == "fill") in >> fill;
        else if (key == "arg") {
            Arg a{0, "", 0, nullptr, 0, 0};
            in >> kind;
            if (kind == "pointer") { a.kind = 'p'; in >> a.path >> a.bytes; }
            else if (kind == "int32") { a.kind = 'i'; in >> a.i; }
            else if (kind == "float32") { a.kind = 'f'; in >> a.f; }
            else fail("unknown argument kind " + kind);
            args.push_back(a);
        } else if (!key.empty()) fail("unknown launch line: " + line);
        if (!key.empty() && in.fail()) fail("malformed launch line: " + line);
    }
    const Entry* entry = entries;
    while (entry->name && name != entry->name) ++entry;
    if (!entry->name) fail("no kernel named " + name);
    check_launch(*entry, args, grid, block, shared, shared_limit);
    std::vector<void*> slots(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
        Arg& a = args[i];
        if (a.kind == 'p') {
            a.pointer = malloc(a.bytes ? a.bytes : 1);  // exact size: ASan sees any overflow
            FILE* f = fopen(a.path.c_str(), "rb");
            if (!f || fread(a.pointer, 1, a.bytes, f) != a.bytes) fail("cannot read " + a.path);
            fclose(f);
            slots[i] = &a.pointer;
        } else {
            slots[i] = a.kind == 'i' ? (void*)&a.i : (void*)&a.f;
        }
    }
    Launch& L = the_launch;
    L.schedule = schedule == "greedy" ? GREEDY : schedule == "shuffled" ? SHUFFLED : LOCKSTEP;
    if (schedule != "lockstep" && L.schedule == LOCKSTEP) fail("unknown schedule " + schedule);
    L.seed = seed;
    L.fill = fill;
    launch_kernel(entry->run, slots.data(), grid, block, shared);
    EMU_RACE(__tsan_ignore_thread_begin());  // the host reads results after the kernel: no race
    for (Arg& a : args) {
        if (a.kind != 'p') continue;
        FILE* f = fopen(a.path.c_str(), "wb");
        if (!f || fwrite(a.pointer, 1, a.bytes, f) != a.bytes) fail("cannot write " + a.path);
        fclose(f);
        free(a.pointer);
    }
    EMU_RACE(__tsan_ignore_thread_end());
    return 0;
}

}  // namespace emu

int main(int argc, char** argv) {
    if (argc != 2) emu::fail("usage: PROGRAM LAUNCH_FILE");
    return emu::run_launch_file(argv[1]);
}
