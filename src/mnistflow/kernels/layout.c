/* Swapping the batch and channel axes of a channels-last tensor: (N, H, W, C) memory to
 * (C, H, W, N) memory, i.e. x.transpose(0, 1).contiguous(memory_format=channels_last).
 * The fast net's tiny-map weight gradient needs both its input and its output gradient in
 * that form every step; PyTorch's copy kernel took 0.15-0.25 ms each at 4x4 maps.
 * Elements are moved as 2- or 4-byte words (no arithmetic); blocks of 16 x 16 keep the
 * strided side of the copy within a few cache lines. */
#include <stdint.h>

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
