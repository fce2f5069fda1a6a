/* AVX-512 register shuffles that lay bf16 data out in pairs (the "VNNI" layout that both AMX's
 * tile products and AVX-512-BF16's vdpbf16ps multiply): two rows of 16 bf16 interleaved into
 * 16 pairs, and the 16 x 16 transpose of 32-bit words (pairs). Include only where
 * __AVX512BW__ is defined. */
#ifndef MNISTFLOW_VNNI_H
#define MNISTFLOW_VNNI_H
#include <immintrin.h>
#include <stdint.h>

/* Interleaves two rows of 16 bf16 into 16 pairs: (a0, b0, a1, b1, ...), AMX's VNNI layout. */
static inline __m512i interleave16(__m256i a, __m256i b) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    return _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
}

/* In-register transpose of a 16 x 16 matrix of 32-bit words: at each distance d = 8, 4, 2, 1
 * the off-diagonal d x d blocks of row pairs (i, i + d) swap. */
static inline void transpose16x16(__m512i r[16]) {
    /* for distance d: row i takes its own words k without bit d and row i+d's k-d with it;
       row i+d takes row i's k+d without bit d and its own words k with it (16+: the 2nd source) */
    static const int32_t lo[4][16] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
        {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
        {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
        {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
    static const int32_t hi[4][16] = {
        {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
        {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
        {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
        {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
    for (int s = 0, d = 8; s < 4; s++, d /= 2) {
        const __m512i va = _mm512_loadu_si512(lo[s]), vb = _mm512_loadu_si512(hi[s]);
        for (int i = 0; i < 16; i++)
            if (!(i & d)) {
                const __m512i x = r[i], y = r[i + d];
                r[i] = _mm512_permutex2var_epi32(x, va, y);
                r[i + d] = _mm512_permutex2var_epi32(x, vb, y);
            }
    }
}

#endif
