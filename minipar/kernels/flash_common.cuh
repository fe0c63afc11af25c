// What every flash-attention kernel file shares: the head dim (each build passes
// -DHEAD_DIM=d), the index type, raw 16-bit float bits, and the constants of the softmax.
#ifndef MINIPAR_FLASH_COMMON_CUH
#define MINIPAR_FLASH_COMMON_CUH

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif

typedef unsigned short half_bits;  // one 16-bit float (fp16, or bf16 in the bf16 kernels), as its raw bits
typedef unsigned short bf16_bits;  // the same bits, named so in the bf16 kernels' parameters
typedef long long index_t;

#define NEG_INF (__uint_as_float(0xff800000u))
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

#endif  // MINIPAR_FLASH_COMMON_CUH
