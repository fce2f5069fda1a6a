/* 2x2 stride-2 max-pooling for channels-last (N, H, W, C) tensors, forward and backward.
 *
 * PyTorch's CPU max-pool writes int64 indices and its backward first zero-fills the whole
 * input gradient, then scatters into it: at the fast net's 14x14x32 stage that was ~20% of a
 * training step. Here the forward records which of the four inputs won as one byte, and the
 * backward writes every input-gradient element exactly once (no fill, no scatter).
 *
 * Semantics are PyTorch's max_pool2d(kernel 2, stride 2, ceil_mode=True): output size
 * ceil(H/2) x ceil(W/2); the first maximum in scan order wins ties; a NaN wins (the last one,
 * if several).
 * bf16 values are handled as their uint16 bit patterns (compared as floats), fp32 as float;
 * the backward only moves bits (uint16 / uint32).
 *
 * Channels go in blocks of 16 (a constant trip count, one AVX-512 vector) so that the
 * compiler vectorizes them; the backward selects with a bit mask rather than `?:`, which
 * GCC 12 -O3 -march=native miscompiled for mixed uint8/uint16 widths.
 *
 * The kernels are written once, in maxpool_impl.h, included below once per element type.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "mnistflow_kernels.h"

/* maxpool2x2_forward_bf16, maxpool2x2_backward_u16 */
#define T uint16_t
#define LOAD bf16_load
#define NEG_INF 0xFF80  /* bf16 -inf */
#define SUFFIX bf16
#define WORD uint16_t
#define WORD_SUFFIX u16
#include "maxpool_impl.h"

/* maxpool2x2_forward_f32, maxpool2x2_backward_u32 */
#define T float
#define LOAD f32_load
#define NEG_INF -INFINITY
#define SUFFIX f32
#define WORD uint32_t
#define WORD_SUFFIX u32
#include "maxpool_impl.h"
