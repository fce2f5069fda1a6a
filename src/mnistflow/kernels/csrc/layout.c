/* Layout kernels.
 *
 * Swapping the batch and channel axes of a channels-last tensor: (N, H, W, C) memory to
 * (C, H, W, N) memory, i.e. x.transpose(0, 1).contiguous(memory_format=channels_last).
 * The fast net's tiny-map weight gradient needs both its input and its output gradient in
 * that form every step; PyTorch's copy kernel took 0.15-0.25 ms each at 4x4 maps.
 * Elements are moved as 2- or 4-byte words (no arithmetic); blocks of 16 x 16 keep the
 * strided side of the copy within a few cache lines. */
#include <stdint.h>

#include "bf16.h"
#include "mnistflow_kernels.h"

#define TILE 16

#define SWAP(NAME, T)                                                                          \
void NAME(const T *src, T *dst, int64_t N, int64_t P, int64_t C, int threads) {               \
    _Pragma("omp parallel for num_threads(threads) collapse(2) schedule(static)")              \
    for (int64_t c0 = 0; c0 < C; c0 += TILE)                                                   \
        for (int64_t p = 0; p < P; p++)                                                        \
            for (int64_t n0 = 0; n0 < N; n0 += TILE) {                                         \
                int64_t c1 = c0 + TILE < C ? c0 + TILE : C, n1 = n0 + TILE < N ? n0 + TILE : N; \
                for (int64_t c = c0; c < c1; c++)                                              \
                    for (int64_t n = n0; n < n1; n++)                                          \
                        dst[(c * P + p) * N + n] = src[(n * P + p) * C + c];                   \
            }                                                                                  \
}
SWAP(swap_nc_u16, uint16_t)
SWAP(swap_nc_u32, uint32_t)

/* The input gradient of a VALID K x K convolution from each window's share of it (col2im):
 * gc (N, OH, OW, K, K, C) -> gx (N, H, W, C), gx[n, y, x] = sum over the windows (i, j) that
 * hold pixel (y, x) of gc[n, i, j, y - i, x - j]. One pass writing each element once, sums in
 * fp32 (PyTorch's zero fill plus one strided add per window took 0.5 ms on the fast net's
 * 384 x 4 x 4 x 48 map, longer than the matrix product that made gc). */
#define COL2IM(NAME, T, LOAD, STORE)                                                                            \
void NAME(const T *restrict gc, T *restrict gx, int64_t N, int64_t H, int64_t W, int64_t C, int64_t K,          \
          int threads) {                                                                                        \
    const int64_t OH = H - K + 1, OW = W - K + 1;                                                               \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                                           \
    for (int64_t n = 0; n < N; n++) {                                                                           \
        float acc[C];                                                                                           \
        for (int64_t y = 0; y < H; y++)                                                                         \
            for (int64_t x = 0; x < W; x++) {                                                                   \
                _Pragma("omp simd") for (int64_t c = 0; c < C; c++) acc[c] = 0.f;                               \
                int64_t i0 = y - K + 1 > 0 ? y - K + 1 : 0, i1 = y < OH - 1 ? y : OH - 1;                       \
                int64_t j0 = x - K + 1 > 0 ? x - K + 1 : 0, j1 = x < OW - 1 ? x : OW - 1;                       \
                for (int64_t i = i0; i <= i1; i++)                                                              \
                    for (int64_t j = j0; j <= j1; j++) {                                                        \
                        const T *restrict s = gc + ((((n * OH + i) * OW + j) * K + (y - i)) * K + (x - j)) * C; \
                        _Pragma("omp simd") for (int64_t c = 0; c < C; c++) acc[c] += LOAD(s[c]);               \
                    }                                                                                           \
                T *restrict d = gx + ((n * H + y) * W + x) * C;                                                 \
                _Pragma("omp simd") for (int64_t c = 0; c < C; c++) d[c] = STORE(acc[c]);                       \
            }                                                                                                   \
    }                                                                                                           \
}
COL2IM(col2im_bf16, uint16_t, bf16_load, bf16_store)
COL2IM(col2im_f32, float, f32_load, f32_store)
