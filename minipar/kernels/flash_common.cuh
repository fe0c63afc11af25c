// What every flash-attention kernel file shares: the head dim (each build passes
// -DHEAD_DIM=d), the index type, raw fp16 bits, and the constants of the softmax.
#ifndef MINIPAR_FLASH_COMMON_CUH
#define MINIPAR_FLASH_COMMON_CUH

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif

typedef unsigned short half_bits;  // one fp16 value, as its raw 16 bits
typedef long long index_t;

#define NEG_INF (__uint_as_float(0xff800000u))
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

#endif  // MINIPAR_FLASH_COMMON_CUH
