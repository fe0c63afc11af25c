// main() of an emulated kernel program (see cpu_emulator.py): reads a launch file
//     kernel NAME | grid X Y Z | block X Y Z | shared BYTES | order K
//     arg pointer PATH BYTES | arg int VALUE | arg float BITS      (one line each, in order)
// loads each buffer into a heap block of exactly BYTES, launches, writes the buffers back.
#pragma once
#include <fstream>
#include <sstream>

namespace emu {

struct Entry { const char* name; void (*run)(void**); const char* signature; };  // p pointer, i int, f float
extern const Entry entries[];

inline std::vector<char> read_file(const std::string& path, size_t bytes) {
    std::vector<char> data(bytes);
    FILE* f = fopen(path.c_str(), "rb");
    if (!f || fread(data.data(), 1, bytes, f) != bytes) fail("cannot read " + path);
    fclose(f);
    return data;
}

inline int run_launch_file(const char* launch_path) {
    std::ifstream launch(launch_path);
    if (!launch) fail(std::string("cannot open ") + launch_path);
    std::string line, name;
    dim3 grid, block;
    size_t shared = 0;
    unsigned order = 0;
    struct Arg { char kind; std::string path; size_t bytes; void* pointer; int i; uint32_t f; };
    std::vector<Arg> args;
    while (std::getline(launch, line)) {
        std::istringstream in(line);
        std::string key, kind;
        in >> key;
        if (key == "kernel") in >> name;
        else if (key == "grid") in >> grid.x >> grid.y >> grid.z;
        else if (key == "block") in >> block.x >> block.y >> block.z;
        else if (key == "shared") in >> shared;
        else if (key == "order") in >> order;
        else if (key == "arg") {
            Arg a{0, "", 0, nullptr, 0, 0};
            in >> kind;
            a.kind = kind[0];
            if (kind == "pointer") in >> a.path >> a.bytes;
            else if (kind == "int") in >> a.i;
            else if (kind == "float") in >> a.f;
            else fail("unknown argument kind " + kind);
            args.push_back(a);
        } else if (!key.empty()) fail("unknown launch line: " + line);
    }
    const Entry* entry = entries;
    while (entry->name && name != entry->name) ++entry;
    if (!entry->name) fail("no kernel named " + name);
    if (strlen(entry->signature) != args.size()) fail(name + ": wrong number of arguments");
    std::vector<void*> slots(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
        Arg& a = args[i];
        if ((a.kind == 'p') != (entry->signature[i] == 'p')) fail(name + ": argument " + std::to_string(i) + " has the wrong kind");
        if (a.kind == 'p') {
            std::vector<char> data = read_file(a.path, a.bytes);
            a.pointer = malloc(a.bytes ? a.bytes : 1);  // exact size: ASan sees any overflow
            memcpy(a.pointer, data.data(), a.bytes);
            slots[i] = &a.pointer;
        } else {
            slots[i] = a.kind == 'i' ? (void*)&a.i : (void*)&a.f;
        }
    }
    launch_kernel(entry->run, slots.data(), grid, block, shared, order);
    for (Arg& a : args) {
        if (a.kind != 'p') continue;
        FILE* f = fopen(a.path.c_str(), "wb");
        if (!f || fwrite(a.pointer, 1, a.bytes, f) != a.bytes) fail("cannot write " + a.path);
        fclose(f);
        free(a.pointer);
    }
    return 0;
}

}  // namespace emu

int main(int argc, char** argv) {
    if (argc != 2) emu::fail("usage: PROGRAM LAUNCH_FILE");
    return emu::run_launch_file(argv[1]);
}
