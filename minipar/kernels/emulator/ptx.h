// The inline-PTX instructions the flash-attention kernels use, modelled on the CPU (see
// emulator.h).  source.py rewrites
//     asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
// into
//     emu::ptx("cvt.rn.f16x2.f32 %0, %1, %2;", {emu::out('r', &(r)), emu::in('f', (hi)), emu::in('f', (lo))});
// so operands keep GCC's numbering (outputs first, then inputs) and the template text is
// interpreted here, statement by statement, with `.reg` temporaries.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16 with
// floating point type"), the same for .f16 and .bf16 inputs, lane = 4g + t; a .b32 register
// holds two 16-bit values, the lower index in the low 16 bits:
//   A (16x16): register i, half h  ->  A[g + 8(i&1)][2t + h + 8(i>>1)]
//   B (16x8):  register i, half h  ->  B[2t + h + 8i][g]
//   C, D (16x8 f32): register i    ->  C[g + 8(i>>1)][2t + (i&1)]
// ldmatrix.m8n8.x4: lanes 8j..8j+7 give the addresses of rows 0..7 of matrix j; lane
// 4g + t receives M_j[g][2t..2t+1] in register j (with .trans: M_j[2t..2t+1][g]).
// cp.async (commit_group, wait_group): async_copy.h.
// In the race build the interpreter's bookkeeping is hidden from ThreadSanitizer; only
// ldmatrix's read of shared memory is the kernel's own access, and is checked.
#pragma once
#include <deque>

#include "async_copy.h"

namespace emu {

struct Operand {
    char kind;         // constraint letter: f (.f32), r (.b32), h (.b16), l (.b64)
    void* target;      // where an output or in/out operand is written back; null for inputs
    uint64_t bits;     // the operand's value as raw bits
};

inline size_t kind_bytes(char kind) {
    switch (kind) {
        case 'h': return 2;
        case 'r': case 'f': return 4;
        case 'l': return 8;
    }
    fail(std::string("asm constraint '") + kind + "' is not modelled");
}

template <class T>
Operand in(char kind, T value) {
    Operand o{kind, nullptr, 0};
    kind_bytes(kind);
    if constexpr (std::is_pointer_v<T>) o.bits = (uint64_t)(uintptr_t)value;
    else if (kind == 'f') o.bits = __float_as_uint((float)value);
    else o.bits = (uint64_t)value & (kind == 'h' ? 0xffffull : kind == 'r' ? 0xffffffffull : ~0ull);
    return o;
}

template <class T>
Operand out(char kind, T* target) {
    if (sizeof(T) != kind_bytes(kind)) fail(std::string("asm output of the wrong size for '") + kind + "'");
    return Operand{kind, (void*)target, 0};
}

template <class T>
Operand inout(char kind, T* target) {
    Operand o = out(kind, target);
    memcpy(&o.bits, target, sizeof(T));
    return o;
}

inline uint16_t f16_bits(float f) {
    _Float16 h = (_Float16)f;  // round to nearest even
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

inline float f16_value(uint16_t b) {
    _Float16 h;
    memcpy(&h, &b, 2);
    return (float)h;
}

// bf16 is the upper half of an fp32: round to nearest even at bit 16 (cvt.rn.bf16.f32);
// NaN stays NaN (the canonical 0x7fff), infinities and subnormals stay what they are.
inline uint16_t bf16_bits(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float bf16_value(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

inline float f32(uint64_t bits) { return __uint_as_float((uint32_t)bits); }
// Half h (0: low, 1: high) of a register holding two f16 or two bf16.
inline float half_of(uint32_t reg, int h, bool bf16) {
    const uint16_t bits = (uint16_t)(reg >> (16 * h));
    return bf16 ? bf16_value(bits) : f16_value(bits);
}

// A and B of one warp's mma, decoded once from the 32 deposits by the first lane to ask.
struct DecodedMma { const Deposit* lanes = nullptr; unsigned serial = 0; float A[16][16], B[16][8]; };

// d = a·b + c for the warp, a and b f16 (or bf16): each lane deposits its fragments and
// computes its own d.  The two input types are two instructions: a warp whose lanes mix
// them stops the launch.
EMU_UNCHECKED inline void mma_m16n8k16(uint32_t d[4], const uint32_t a[4], const uint32_t b[2], const uint32_t c[4],
                                       bool bf16) {
    static std::vector<DecodedMma> decoded;  // per warp of the (one) launch of this process
    uint32_t mine[10];
    memcpy(mine, a, 16); memcpy(mine + 4, b, 8); memcpy(mine + 6, c, 16);
    const Deposit* lanes = warp_exchange(bf16 ? "mma.m16n8k16.f32.bf16.bf16.f32" : "mma.m16n8k16.f32.f16.f16.f32",
                                         mine, sizeof mine);
    const size_t warp = me().linear / 32;
    if (decoded.size() <= warp) decoded.resize(warp + 1);
    DecodedMma& m = decoded[warp];
    if (m.lanes != lanes || m.serial != the_launch.warp_serial[warp]) {
        m.lanes = lanes;
        m.serial = the_launch.warp_serial[warp];
        for (int lane = 0; lane < 32; ++lane) {
            const uint32_t* r = (const uint32_t*)lanes[lane].bytes;
            const int g = lane >> 2, t = lane & 3;
            for (int i = 0; i < 4; ++i)
                for (int h = 0; h < 2; ++h) m.A[g + 8 * (i & 1)][2 * t + h + 8 * (i >> 1)] = half_of(r[i], h, bf16);
            for (int i = 0; i < 2; ++i)
                for (int h = 0; h < 2; ++h) m.B[2 * t + h + 8 * i][g] = half_of(r[4 + i], h, bf16);
        }
    }
    const int g = lane_id() >> 2, t = lane_id() & 3;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float sum = __uint_as_float(c[i]);
        for (int k = 0; k < 16; ++k) sum += m.A[row][k] * m.B[k][col];  // products exact in fp32 (11 or 8 bits each)
        d[i] = __float_as_uint(sum);
    }
}

// Lane 4g + t's registers: M_j[2t][g] (low half) and M_j[2t + 1][g], j = 0..3.
EMU_UNCHECKED inline void ldmatrix_trans_gather(uint32_t d[4], const Deposit* lanes) {
    const int g = lane_id() >> 2, t = lane_id() & 3;
    for (int j = 0; j < 4; ++j) {
        uint16_t lo, hi;
        memcpy(&lo, lanes[8 * j + 2 * t].bytes + 2 * g, 2);
        memcpy(&hi, lanes[8 * j + 2 * t + 1].bytes + 2 * g, 2);
        d[j] = (uint32_t)lo | (uint32_t)hi << 16;
    }
}

// Lane 4g + t's registers without .trans: M_j[g][2t..2t+1], bytes 4t..4t+3 of row g.
EMU_UNCHECKED inline void ldmatrix_gather(uint32_t d[4], const Deposit* lanes) {
    const int g = lane_id() >> 2, t = lane_id() & 3;
    for (int j = 0; j < 4; ++j) memcpy(&d[j], lanes[8 * j + g].bytes + 4 * t, 4);
}

// ldmatrix.m8n8.x4 (.trans or not): each lane reads its row (16 bytes) when it executes.
inline void ldmatrix_x4(uint32_t d[4], uint64_t shared_offset, bool trans) {
    if (shared_offset % 16 != 0 || shared_offset + 16 > the_launch.shared_bytes)
        fail("ldmatrix: row address " + std::to_string(shared_offset) + " is not 16-byte aligned inside " +
             std::to_string(the_launch.shared_bytes) + " bytes of shared memory");
    unsigned char row[16];
    EMU_RACE(__tsan_ignore_thread_end());  // this read is the kernel's: checked for races
    memcpy(row, the_launch.shared + shared_offset, 16);
    EMU_RACE(__tsan_ignore_thread_begin());
    const Deposit* lanes = warp_exchange(trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", row, 16);
    if (trans) ldmatrix_trans_gather(d, lanes);
    else ldmatrix_gather(d, lanes);
}

// ---- the interpreter of an asm template ------------------------------------------------
// A template is parsed once (cached by the address of its string literal) into statements
// whose operands are register slots: %N is slot N, a `.reg` temporary a slot after them.

enum Opcode { CVT_F16X2, CVT_F16, CVT_BF16X2, CVT_BF16, CVTA_SHARED, CVT_U32_U64, MMA_16816, MMA_16816_BF16,
              LDMATRIX_X4, LDMATRIX_X4_TRANS, CP_ASYNC_16, CP_ASYNC_COMMIT, CP_ASYNC_WAIT };
struct OpcodeInfo { const char* name; Opcode op; std::vector<size_t> group_sizes; };  // registers per operand
const OpcodeInfo OPCODES[] = {
    {"cvt.rn.f16x2.f32", CVT_F16X2, {1, 1, 1}}, {"cvt.rn.f16.f32", CVT_F16, {1, 1}},
    {"cvt.rn.bf16x2.f32", CVT_BF16X2, {1, 1, 1}}, {"cvt.rn.bf16.f32", CVT_BF16, {1, 1}},
    {"cvta.to.shared.u64", CVTA_SHARED, {1, 1}}, {"cvt.u32.u64", CVT_U32_U64, {1, 1}},
    {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", MMA_16816, {4, 4, 2, 4}},
    {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", MMA_16816_BF16, {4, 4, 2, 4}},
    {"ldmatrix.sync.aligned.m8n8.x4.shared.b16", LDMATRIX_X4, {4, 1}},
    {"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", LDMATRIX_X4_TRANS, {4, 1}},
    {"cp.async.cg.shared.global", CP_ASYNC_16, {1, 1, 1, 1}}, {"cp.async.commit_group", CP_ASYNC_COMMIT, {}},
    {"cp.async.wait_group", CP_ASYNC_WAIT, {1}}};

struct Statement { Opcode op; std::vector<std::vector<int>> args; };  // args: groups of slots
struct Program {
    std::vector<Statement> statements;
    size_t slots = 0;
    std::vector<std::pair<int, uint64_t>> constants;  // (slot, value) of the integer literals
};

inline std::string trim(const std::string& s) {
    size_t a = s.find_first_not_of(" \t\n"), b = s.find_last_not_of(" \t\n");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// "a, {b, c}, [d]" -> {"a", "{b, c}", "[d]"}
inline std::vector<std::string> split_operands(const std::string& s) {
    std::vector<std::string> parts;
    int depth = 0;
    std::string cur;
    for (char ch : s) {
        depth += (ch == '{' || ch == '[') - (ch == '}' || ch == ']');
        if (ch == ',' && depth == 0) { parts.push_back(trim(cur)); cur.clear(); }
        else cur += ch;
    }
    if (!trim(cur).empty()) parts.push_back(trim(cur));
    return parts;
}

inline Program parse(const std::string& text, size_t n_operands) {
    Program program;
    std::vector<std::string> temps;
    auto slot = [&](std::string name) {
        name = trim(name);
        if (!name.empty() && isdigit((unsigned char)name[0])) {  // an integer literal: a constant slot
            temps.push_back("#" + name);
            program.constants.push_back({(int)(n_operands + temps.size() - 1), std::stoull(name)});
            return (int)(n_operands + temps.size() - 1);
        }
        if (name.size() > 1 && name[0] == '%' && isdigit((unsigned char)name[1])) {
            size_t n = std::stoul(name.substr(1));
            if (n >= n_operands) fail("asm operand " + name + " does not exist in '" + text + "'");
            return (int)n;
        }
        for (size_t i = 0; i < temps.size(); ++i) if (temps[i] == name) return (int)(n_operands + i);
        fail("asm register '" + name + "' is not declared in '" + text + "'");
    };
    std::string body = text;
    for (char& ch : body) if (ch == '\n' || ch == '\t') ch = ' ';
    body = trim(body);
    if (!body.empty() && body.front() == '{') body = body.substr(1, body.rfind('}') - 1);
    size_t start = 0;
    for (size_t semi; (semi = body.find(';', start)) != std::string::npos; start = semi + 1) {
        const std::string statement = trim(body.substr(start, semi - start));
        if (statement.empty()) continue;
        const size_t space = statement.find(' ');
        const std::string name = statement.substr(0, space), rest = space == std::string::npos ? "" : statement.substr(space);
        if (name == ".reg") {  // ".reg .u64 t, u"
            const std::string names = trim(rest);
            for (const std::string& temp : split_operands(names.substr(names.find(' ') + 1))) temps.push_back(temp);
            continue;
        }
        Statement parsed;
        const OpcodeInfo* info = nullptr;
        for (const OpcodeInfo& entry : OPCODES) if (name == entry.name) info = &entry;
        if (!info) fail("PTX instruction not modelled: '" + statement + "'");
        parsed.op = info->op;
        for (const std::string& operand : split_operands(rest)) {
            std::vector<int> group;
            if (operand.front() == '{' || operand.front() == '[') {
                for (const std::string& item : split_operands(operand.substr(1, operand.size() - 2))) group.push_back(slot(item));
            } else {
                group.push_back(slot(operand));
            }
            parsed.args.push_back(group);
        }
        bool shape_ok = parsed.args.size() == info->group_sizes.size();
        for (size_t i = 0; shape_ok && i < parsed.args.size(); ++i) shape_ok = parsed.args[i].size() == info->group_sizes[i];
        if (!shape_ok) fail("wrong operands for " + name + ": '" + statement + "'");
        program.statements.push_back(parsed);
    }
    if (!trim(body.substr(start)).empty()) fail("asm text does not end with ';': '" + body + "'");
    program.slots = n_operands + temps.size();
    return program;
}

inline void execute(const Statement& s, uint64_t* r) {
    const std::vector<std::vector<int>>& x = s.args;
    switch (s.op) {
        case CVT_F16X2:  // d = {a -> upper half, b -> lower half}
            r[x[0][0]] = (uint64_t)f16_bits(f32(r[x[1][0]])) << 16 | f16_bits(f32(r[x[2][0]]));
            break;
        case CVT_F16:
            r[x[0][0]] = f16_bits(f32(r[x[1][0]]));
            break;
        case CVT_BF16X2:  // d = {a -> upper half, b -> lower half}
            r[x[0][0]] = (uint64_t)bf16_bits(f32(r[x[1][0]])) << 16 | bf16_bits(f32(r[x[2][0]]));
            break;
        case CVT_BF16:
            r[x[0][0]] = bf16_bits(f32(r[x[1][0]]));
            break;
        case CVTA_SHARED: {
            const uint64_t address = r[x[1][0]], base = (uint64_t)(uintptr_t)the_launch.shared;
            if (address < base || address >= base + the_launch.shared_bytes)
                fail("cvta.to.shared: the address is not in this block's shared memory");
            r[x[0][0]] = address - base;
            break;
        }
        case CVT_U32_U64:
            r[x[0][0]] = r[x[1][0]] & 0xffffffffull;
            break;
        case MMA_16816:
        case MMA_16816_BF16: {
            uint32_t a[4], b[2], c[4], d[4];
            for (int i = 0; i < 4; ++i) { a[i] = (uint32_t)r[x[1][i]]; c[i] = (uint32_t)r[x[3][i]]; }
            for (int i = 0; i < 2; ++i) b[i] = (uint32_t)r[x[2][i]];
            mma_m16n8k16(d, a, b, c, s.op == MMA_16816_BF16);
            for (int i = 0; i < 4; ++i) r[x[0][i]] = d[i];
            break;
        }
        case LDMATRIX_X4:
        case LDMATRIX_X4_TRANS: {
            uint32_t d[4];
            ldmatrix_x4(d, r[x[1][0]], s.op == LDMATRIX_X4_TRANS);
            for (int i = 0; i < 4; ++i) r[x[0][i]] = d[i];
            break;
        }
        case CP_ASYNC_16:
            cp_async_issue(r[x[0][0]], r[x[1][0]], r[x[2][0]], r[x[3][0]]);
            break;
        case CP_ASYNC_COMMIT:
            cp_async_commit();
            break;
        case CP_ASYNC_WAIT:
            cp_async_wait(r[x[0][0]]);
            break;
    }
}

// One asm statement.  Templates are parsed once per (string literal, operand count).
EMU_UNCHECKED inline void ptx(const char* text, std::initializer_list<Operand> operands) {
    struct Parsed { const char* text; size_t operands; Program program; };
    static std::deque<Parsed> cache;  // a deque: references stay valid as it grows
    EMU_RACE(__tsan_ignore_thread_begin());
    const Program* program = nullptr;
    for (const Parsed& entry : cache)
        if (entry.text == text && entry.operands == operands.size()) program = &entry.program;
    if (!program) {
        cache.push_back({text, operands.size(), parse(text, operands.size())});
        program = &cache.back().program;
    }
    uint64_t slots[64] = {};
    if (program->slots > 64) fail("asm statement with too many registers");
    size_t n = 0;
    for (const Operand& o : operands) slots[n++] = o.bits;
    for (const auto& [slot, value] : program->constants) slots[slot] = value;
    for (const Statement& statement : program->statements) execute(statement, slots);
    n = 0;
    for (const Operand& o : operands) {
        if (o.target) memcpy(o.target, &slots[n], kind_bytes(o.kind));  // little-endian: low bytes
        ++n;
    }
    EMU_RACE(__tsan_ignore_thread_end());
}

}  // namespace emu
