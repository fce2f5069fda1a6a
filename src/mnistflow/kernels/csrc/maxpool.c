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
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "mnistflow_kernels.h"

#define MAX4(NAME, T, LOAD)                                                                    \
static inline void NAME(const T *restrict a, const T *restrict b, const T *restrict c,       \
                        const T *restrict d, T *restrict y, uint8_t *restrict code, int64_t n) { \
    for (int64_t k = 0; k < n; k++) {                                                          \
        float m = LOAD(a[k]), vb = LOAD(b[k]), vc = LOAD(c[k]), vd = LOAD(d[k]);               \
        T mt = a[k];                                                                           \
        uint8_t i = 0;                                                                         \
        if (vb > m || vb != vb) { m = vb; mt = b[k]; i = 1; }                                  \
        if (vc > m || vc != vc) { m = vc; mt = c[k]; i = 2; }                                  \
        if (vd > m || vd != vd) { m = vd; mt = d[k]; i = 3; }                                  \
        y[k] = mt;                                                                             \
        code[k] = i;                                                                           \
    }                                                                                          \
}
MAX4(max4_bf16, uint16_t, bf16_load)
MAX4(max4_f32, float, f32_load)

/* y (N, OH, OW, C) and code (N, OH, OW, C): code = dy * 2 + dx of the winner. A window cut by
   the edge (odd sizes, ceil mode) reads -inf for its missing inputs: they never win, as in
   PyTorch, which does not visit them. Returns 1 when out of memory. */
#define FORWARD(NAME, T, MAX, NEG_INF)                                                         \
int NAME(const T *x, T *y, uint8_t *code, int64_t N, int64_t H, int64_t W, int64_t C,          \
         int threads) {                                                                        \
    const int64_t OH = (H + 1) / 2, OW = (W + 1) / 2;                                          \
    T *none = malloc((size_t)C * sizeof(T));                                                   \
    if (!none) return 1;                                                                       \
    for (int64_t k = 0; k < C; k++) none[k] = NEG_INF;                                         \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                          \
    for (int64_t n = 0; n < N; n++)                                                            \
        for (int64_t oh = 0; oh < OH; oh++) {                                                  \
            const int64_t h0 = 2 * oh, h1 = h0 + 1;                                            \
            for (int64_t ow = 0; ow < OW; ow++) {                                              \
                const int64_t w0 = 2 * ow, w1 = w0 + 1;                                        \
                const T *a = x + ((n * H + h0) * W + w0) * C;                                  \
                const T *b = w1 < W ? x + ((n * H + h0) * W + w1) * C : none;                  \
                const T *c = h1 < H ? x + ((n * H + h1) * W + w0) * C : none;                  \
                const T *d = h1 < H && w1 < W ? x + ((n * H + h1) * W + w1) * C : none;        \
                const int64_t o = ((n * OH + oh) * OW + ow) * C;                               \
                int64_t k = 0;                                                                 \
                for (; k + 16 <= C; k += 16)                                                   \
                    MAX(a + k, b + k, c + k, d + k, y + o + k, code + o + k, 16);              \
                MAX(a + k, b + k, c + k, d + k, y + o + k, code + o + k, C - k);               \
            }                                                                                  \
        }                                                                                      \
    free(none);                                                                                \
    return 0;                                                                                  \
}
FORWARD(maxpool2x2_forward_bf16, uint16_t, max4_bf16, 0xFF80)  /* bf16 -inf */
FORWARD(maxpool2x2_forward_f32, float, max4_f32, -INFINITY)

#define PICK(NAME, T)                                                                          \
static inline void NAME(const T *restrict g, const uint8_t *restrict code, T *restrict out,   \
                        uint8_t want, int64_t n) {                                             \
    for (int64_t k = 0; k < n; k++) out[k] = g[k] & (T)-(T)(code[k] == want);                  \
}
PICK(pick_u16, uint16_t)
PICK(pick_u32, uint32_t)

/* gx (N, H, W, C), every element written once: g where the code points at it, else 0. */
#define BACKWARD(NAME, T, PICKF)                                                               \
void NAME(const T *g, const uint8_t *code, T *gx, int64_t N, int64_t H, int64_t W, int64_t C, \
          int threads) {                                                                       \
    const int64_t OH = (H + 1) / 2, OW = (W + 1) / 2;                                          \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                          \
    for (int64_t n = 0; n < N; n++)                                                            \
        for (int64_t h = 0; h < H; h++)                                                        \
            for (int64_t w = 0; w < W; w++) {                                                  \
                const int64_t i = ((n * OH + h / 2) * OW + w / 2) * C;                         \
                const uint8_t want = (uint8_t)((h & 1) * 2 + (w & 1));                         \
                T *out = gx + ((n * H + h) * W + w) * C;                                       \
                int64_t k = 0;                                                                 \
                for (; k + 16 <= C; k += 16) PICKF(g + i + k, code + i + k, out + k, want, 16); \
                PICKF(g + i + k, code + i + k, out + k, want, C - k);                          \
            }                                                                                  \
}
BACKWARD(maxpool2x2_backward_u16, uint16_t, pick_u16)
BACKWARD(maxpool2x2_backward_u32, uint32_t, pick_u32)
