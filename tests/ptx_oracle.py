"""Independent pure-NumPy oracle for four NVIDIA PTX warp-level operations.

Written from documentation only (not from minipar's kernels) to check a CPU
emulator of CUDA kernels.  Warp state is modelled as arrays whose first axis is
the lane (0..31).  Notation: g = groupID = lane >> 2, t = threadID_in_group =
lane % 4.

Packing of two 16-bit values in one .b32 register: the PTX ISA lists fragment
elements "low to high" (a0 in bits 0..15, a1 in bits 16..31); CuTe's fragment
layouts index half_t values in that same order (little-endian recast of the
uint32 registers).  So the element with the LOWER index is in the LOW half.

Sources (most trusted first; PTX = https://docs.nvidia.com/cuda/parallel-thread-execution/):
  [PTX-MMA] PTX ISA 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating
      point type" (#warp-level-matrix-fragment-mma-16816-float)
  [PTX-LDM] PTX ISA "ldmatrix" (#warp-level-matrix-instructions-ldmatrix)
  [PTX-CVT] PTX ISA "cvt" (#data-movement-and-conversion-instructions-cvt)
  [PTX-SHFL] PTX ISA "shfl.sync" (.bfly semantics)
  [CUTE-MMA] NVIDIA/cutlass include/cute/atom/mma_traits_sm80.hpp
      (SM80_16x8x16_F16F16F16F16_TN layouts, inherited by ..._F32F16F16F32_TN)
  [CUTE-LDSM] NVIDIA/cutlass include/cute/atom/copy_traits_sm75.hpp
      (SM75_U32x4_LDSM_N, SM75_U16x8_LDSM_T)
  [FA2] Dao-AILab/flash-attention csrc/flash_attn/src/kernel_traits.h: P@V loads
      row-major V with SM75_U16x8_LDSM_T (ldmatrix .x4.trans) as the mma B operand.
The self-check re-derives every layout from the CuTe layouts and compares them
with the PTX-formula tables used by the functions.
"""
import numpy as np

LANES = np.arange(32)
_G, _T = LANES >> 2, LANES & 3


def _split(r):
    """uint32 registers -> (low16, high16) as uint16."""
    r = np.asarray(r, dtype=np.uint32)
    return (r & 0xFFFF).astype(np.uint16), (r >> 16).astype(np.uint16)


def _join(lo, hi):
    """two 16-bit bit patterns -> uint32 with `lo` in bits 0..15."""
    lo, hi = (np.asarray(x).view(np.uint16).astype(np.uint32) for x in (lo, hi))
    return (lo | (hi << 16)).astype(np.uint32)


# ----------------------------------------------------------------- mma tables
# Element i of a lane's fragment lives in register i // 2, half i % 2 (low=0).
# [PTX-MMA], A (16x16, .row), a0..a7:
#   row = g       for i in {0,1,4,5};  g + 8 otherwise
#   col = 2t + (i & 1)  for i < 4;     2t + (i & 1) + 8 for i >= 4
# => reg0 = A[g, 2t:2t+2], reg1 = A[g+8, 2t:2t+2], reg2 = A[g, 2t+8:2t+10],
#    reg3 = A[g+8, 2t+8:2t+10].
# Disagreement seen: an exploratory public test ("test_mma_identity.c", probing sm_120)
# packs reg1 = A[g, 2t+8..], reg2 = A[g+8, 2t..]; the PTX ISA and CuTe's ALayout
# (value bit 1 -> stride 8 = row+8) agree with each other against it; we follow them.
_I8 = np.arange(8)
A_ROW = _G[:, None] + 8 * ((_I8[None, :] >> 1) & 1)            # (32, 8)
A_COL = 2 * _T[:, None] + (_I8[None, :] & 1) + 8 * (_I8[None, :] >> 2)
# [PTX-MMA], B (16x8 = K x N, .col), b0..b3:
#   row(k) = 2t + (i & 1) for i < 2; 2t + (i & 1) + 8 for i >= 2;  col(n) = g
# => reg0 = (B[2t, g], B[2t+1, g]), reg1 = (B[2t+8, g], B[2t+9, g]).
_I4 = np.arange(4)
B_ROW = 2 * _T[:, None] + (_I4[None, :] & 1) + 8 * (_I4[None, :] >> 1)  # (32, 4)
B_COL = np.repeat(_G[:, None], 4, axis=1)
# [PTX-MMA], C/D (16x8, f32), c0..c3, one float per register:
#   row = g for i < 2; g + 8 for i >= 2;  col = 2t + (i & 1)
C_ROW = _G[:, None] + 8 * (_I4[None, :] >> 1)                   # (32, 4)
C_COL = 2 * _T[:, None] + (_I4[None, :] & 1)


def _unpack16(regs, rows, cols, shape):
    lo, hi = _split(regs)
    M = np.zeros(shape, np.uint16)
    M[rows, cols] = np.stack([lo, hi], axis=-1).reshape(rows.shape)  # element i = 2*reg + half
    return M.view(np.float16)


def _pack16(M, rows, cols):
    h = np.asarray(M, np.float16)[rows, cols]
    return _join(h[:, 0::2], h[:, 1::2])


def unpack_a(a):  # (32,4) uint32 A registers -> (16,16) float16 A
    return _unpack16(a, A_ROW, A_COL, (16, 16))


def pack_a(A):  # (16,16) float16 -> (32,4) uint32 A registers
    return _pack16(A, A_ROW, A_COL)


def unpack_b(b):  # (32,2) uint32 B registers -> (16,8) float16 B (K x N)
    return _unpack16(b, B_ROW, B_COL, (16, 8))


def pack_b(B):  # (16,8) float16 B (K x N) -> (32,2) uint32 B registers
    return _pack16(B, B_ROW, B_COL)


def unpack_c(c):
    """(32,4) float32 C/D registers -> (16,8) float32 matrix."""
    C = np.zeros((16, 8), np.float32)
    C[C_ROW, C_COL] = np.asarray(c, np.float32)
    return C


def pack_c(C):  # (16,8) float32 -> (32,4) float32 C/D registers
    return np.asarray(C, np.float32)[C_ROW, C_COL]


def mma_m16n8k16_f32_f16(a, b, c):
    """mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 d, a, b, c.

    D = A.B + C with products/sums in float64 and one rounding to float32.  Real
    tensor cores do not promise this exact rounding (internal accumulation order
    and truncation are unspecified), so compare hardware/emulator results with a
    small tolerance; an emulator that does the same float64 computation is exact.
    """
    A, B = unpack_a(a).astype(np.float64), unpack_b(b).astype(np.float64)
    return pack_c((A @ B + unpack_c(c).astype(np.float64)).astype(np.float32))


# ------------------------------------------------------------------- ldmatrix
def _ldmatrix_x4(memory_u16, row_addresses, trans, check_alignment):
    """[PTX-LDM]: addresses of lanes 0-7 are the rows 0-7 of matrix 0 (-> r0),
    lanes 8-15 -> matrix 1 (r1), 16-23 -> matrix 2 (r2), 24-31 -> matrix 3 (r3).
    Each row is 8 consecutive b16 (16 bytes, must be 16-byte aligned)."""
    mem = np.asarray(memory_u16).view(np.uint16).reshape(-1)
    addr = np.asarray(row_addresses, dtype=np.int64).reshape(32)
    if check_alignment and np.any(addr % 8):
        raise ValueError("ldmatrix row address not 16-byte aligned: %s" % addr)
    if np.any(addr < 0) or np.any(addr + 8 > mem.size):
        raise IndexError("ldmatrix row address out of range")
    M = mem[addr[:, None] + np.arange(8)].reshape(4, 8, 8)   # M[m, row, col]
    out = np.zeros((32, 4), np.uint32)
    for m in range(4):
        if not trans:   # lane gets row g, columns 2t, 2t+1 (low, high)
            out[:, m] = _join(M[m, _G, 2 * _T], M[m, _G, 2 * _T + 1])
        else:           # .trans: lane gets column g, rows 2t, 2t+1 (low, high)
            out[:, m] = _join(M[m, 2 * _T, _G], M[m, 2 * _T + 1, _G])
    return out


def ldmatrix_x4_b16(memory_u16, row_addresses, check_alignment=True):
    """ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0,r1,r2,r3}, [addr].

    row_addresses: (32,) element (not byte) indices into memory_u16.  Lane L gets in
    r_m: low = M_m[L>>2][2*(L%4)], high = M_m[L>>2][2*(L%4)+1] ("a group of four
    threads loads an entire row", [PTX-LDM]; CuTe SM75_U32x4_LDSM_N DstLayout
    (32,(32,4)):(32,(1,1024)) says the same: lane L, bit b of r_m = bit 32L+b of
    matrix m).  Returns (32,4) uint32."""
    return _ldmatrix_x4(memory_u16, row_addresses, False, check_alignment)


def ldmatrix_x4_trans_b16(memory_u16, row_addresses, check_alignment=True):
    """ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {r0,r1,r2,r3}, [addr].

    Same addressing as ldmatrix_x4_b16; with .trans ("loaded in column-major
    format", [PTX-LDM]) lane L gets in r_m: low = M_m[2*(L%4)][L>>2],
    high = M_m[2*(L%4)+1][L>>2], i.e. the non-trans fragment of M_m^T.  From CuTe
    SM75_U16x8_LDSM_T DstLayout ((4,8),(16,2,4)):((256,16),(1,128,1024)): lane
    t+4g, half h of r_m = 16-bit element at bit 256t+128h+16g of matrix m = row
    2t+h, column g.  Used as mma B operand: with V (K x N) row-major and lane L
    addressing V[k0 + (L & 15), n0 + 8*(L >> 4)], (r0, r1) is the B fragment of
    V[k0:k0+16, n0:n0+8] and (r2, r3) that of V[k0:k0+16, n0+8:n0+16]."""
    return _ldmatrix_x4(memory_u16, row_addresses, True, check_alignment)


# ------------------------------------------------------------------------ cvt
def cvt_rn_f16x2_f32(src1, src2):
    """cvt.rn.f16x2.f32 d, src1, src2.

    [PTX-CVT]: "the value converted from input a is stored in the upper half of d
    and the value converted from input b is stored in the lower half of d".  So
    d = f16(src1) << 16 | f16(src2).  (CUDA's __floats2half2_rn(lo, hi) therefore
    emits `cvt.rn.f16x2.f32 %0, hi, lo`.)  Rounding: round-to-nearest-even,
    overflow -> +-inf, subnormal f16 results kept; NumPy's float32->float16 cast
    does exactly that.  NaN payloads are not modelled (hardware may canonicalise)."""
    with np.errstate(over="ignore"):          # overflow to inf is the specified result
        hi = np.asarray(src1, np.float32).astype(np.float16)
        lo = np.asarray(src2, np.float32).astype(np.float16)
    return _join(lo, hi)


# ---------------------------------------------------------------------- shfl
def shfl_xor(values, lane_mask):
    """__shfl_xor_sync(0xffffffff, v, lane_mask) (width 32): lane L returns the
    value of lane L ^ lane_mask.  [PTX-SHFL] .bfly: j = lane ^ b[4:0]; with the
    full-warp clamp (c = 0x1f) j is always in range, so only the low 5 bits of
    lane_mask matter.  values: array with leading axis 32."""
    v = np.asarray(values)
    assert v.shape[0] == 32
    return v[LANES ^ (int(lane_mask) & 31)]


# ---------------------------------------------------------------- self-check
def _cute(shape_strides, coords_shape):
    """Evaluate a CuTe layout (thread modes (4,8), value modes listed) into
    (lane, value) -> coordinate tuple of a column-major `coords_shape` domain."""
    (ts, tstr), (vs, vstr) = shape_strides
    out = np.zeros((32, int(np.prod(vs))), np.int64)
    for lane in range(32):
        for v in range(out.shape[1]):
            idx, rem = lane % 4 * tstr[0] + lane // 4 * tstr[1], v
            for s, st in zip(vs, vstr):
                idx, rem = idx + (rem % s) * st, rem // s
            out[lane, v] = idx
    return np.unravel_index(out, coords_shape, order="F")


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    # 1. tables vs CuTe layouts [CUTE-MMA]  (domains: A (M16,K16), B (N8,K16), C (M16,N8))
    m, k = _cute((((4, 8), (32, 1)), ((2, 2, 2), (16, 8, 128))), (16, 16))
    assert (m == A_ROW).all() and (k == A_COL).all()
    n, k = _cute((((4, 8), (16, 1)), ((2, 2), (8, 64))), (8, 16))
    assert (k == B_ROW).all() and (n == B_COL).all()
    m, n = _cute((((4, 8), (32, 1)), ((2, 2), (16, 8))), (16, 8))
    assert (m == C_ROW).all() and (n == C_COL).all()
    for R, Cc, n_el in ((A_ROW, A_COL, 256), (B_ROW, B_COL, 128), (C_ROW, C_COL, 128)):
        assert len(set(zip(R.ravel(), Cc.ravel()))) == R.size == n_el   # each element exactly once
    # spot check straight from the PTX text: lane 5 (g=1, t=1)
    A = rng.standard_normal((16, 16)).astype(np.float16)
    a = pack_a(A)
    assert a[5, 0] == _join(A[1, 2], A[1, 3]) and a[5, 1] == _join(A[9, 2], A[9, 3])
    assert a[5, 2] == _join(A[1, 10], A[1, 11]) and a[5, 3] == _join(A[9, 10], A[9, 11])
    # 2. mma vs A@B+C
    B = rng.standard_normal((16, 8)).astype(np.float16)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    assert pack_b(B)[5, 1] == _join(B[10, 1], B[11, 1])
    assert (unpack_a(a) == A).all() and (unpack_b(pack_b(B)) == B).all() and (unpack_c(pack_c(C)) == C).all()
    ref = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(np.float32)
    d = mma_m16n8k16_f32_f16(a, pack_b(B), pack_c(C))
    assert (unpack_c(d) == ref).all() and d[5, 2] == ref[9, 2]
    # 3. ldmatrix vs CuTe bit layouts [CUTE-LDSM], on a padded row-major tile
    stride, base = 24, 40                            # 48-byte rows, offset 80 bytes
    mem = rng.integers(0, 1 << 16, base + 16 * stride + 8, dtype=np.uint16)
    addr = base + (LANES & 15) * stride + 8 * (LANES >> 4)
    tile = mem[base:base + 16 * stride].reshape(16, stride)[:, :16]
    mats = [tile[0:8, 0:8], tile[8:16, 0:8], tile[0:8, 8:16], tile[8:16, 8:16]]  # by address group
    bits = lambda M: np.unpackbits(M.astype('<u2').view(np.uint8), bitorder="little")
    rN, rT = ldmatrix_x4_b16(mem, addr), ldmatrix_x4_trans_b16(mem, addr)
    regbits = lambda r: (r.astype(np.int64)[:, None] >> np.arange(32)) & 1      # (32 lanes, 32 bits)
    j = np.arange(32)                                  # register bit j = 16*h + i
    for mi, M in enumerate(mats):
        bm = bits(M)                                   # bit 128*row + 16*col + i of matrix M
        assert (regbits(rN[:, mi]) == bm.reshape(32, 32)).all()               # N: lane L <- bits 32L..
        idx = 256 * _T[:, None] + 16 * _G[:, None] + 128 * (j >> 4) + (j & 15)  # T: CuTe DstLayout
        assert (regbits(rT[:, mi]) == bm[idx]).all()
    # 4. FlashAttention-style use: O = P @ V (V row-major K x N in smem, .trans -> B),
    #    S = Q @ K^T (Q row-major -> A via plain x4; K row-major N x K -> B via plain x4)
    V = tile.view(np.float16)
    V = np.where(np.isfinite(V), V, 0).astype(np.float16)
    tile[:] = V.view(np.uint16)
    rT = ldmatrix_x4_trans_b16(mem, addr)
    assert (unpack_b(rT[:, 0:2]) == V[:, 0:8]).all() and (unpack_b(rT[:, 2:4]) == V[:, 8:16]).all()
    P = (rng.standard_normal((16, 16)) / 4).astype(np.float16)
    o = [mma_m16n8k16_f32_f16(pack_a(P), rT[:, 2 * j:2 * j + 2], np.zeros((32, 4), np.float32)) for j in range(2)]
    O = np.concatenate([unpack_c(x) for x in o], axis=1)
    assert np.allclose(O, P.astype(np.float64) @ V.astype(np.float64), rtol=1e-6, atol=1e-3)
    assert (ldmatrix_x4_b16(mem, addr) == pack_a(V)).all()       # A operand from row-major tile
    addr_k = base + ((LANES & 7) + 8 * (LANES >> 4)) * stride + 8 * ((LANES >> 3) & 1)
    rK = ldmatrix_x4_b16(mem, addr_k)                             # tile read as K[n, k]
    assert (unpack_b(rK[:, 0:2]) == V[0:8, :].T).all() and (unpack_b(rK[:, 2:4]) == V[8:16, :].T).all()
    # 5. cvt: src1 -> upper half, RNE ties, overflow
    assert cvt_rn_f16x2_f32(1.0, 2.0) == 0x3C004000
    assert cvt_rn_f16x2_f32(np.float32(1 + 2**-11), np.float32(1 + 3 * 2**-11)) == 0x3C003C02
    assert cvt_rn_f16x2_f32(65520.0, -65519.0) == 0x7C00FBFF
    assert cvt_rn_f16x2_f32(np.float32(2**-25), np.float32(1.5 * 2**-24)) == 0x00000002  # subnormal ties
    assert (cvt_rn_f16x2_f32(np.ones(3), np.zeros(3)) == 0x3C000000).all()
    # 6. shfl_xor butterflies: full-warp sum and FlashAttention-style quad (mask 2, 1) reduce
    v = np.arange(32.0)
    assert shfl_xor(v, 1)[0] == 1 and shfl_xor(v, 16)[3] == 19
    s, q = v.copy(), v.copy()
    for msk in (16, 8, 4, 2, 1):
        s = s + shfl_xor(s, msk)
        q = q + shfl_xor(q, msk) if msk < 4 else q
    assert (s == v.sum()).all() and (q == v.reshape(8, 4).sum(1).repeat(4)).all()
    print("ptx_oracle self-check: all passed")
