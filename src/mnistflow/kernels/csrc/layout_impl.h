/* The layout kernels for one element size, included by layout.c once per size with
 *   T, LOAD, STORE  the stored type and its conversions to and from float (col2im's sums);
 *   WORD            the unsigned integer of T's size (the swap only moves bits);
 *   SUFFIX, WORD_SUFFIX  the names' suffixes: NAME(f) is f_SUFFIX, WORD_NAME(f) f_WORD_SUFFIX.
 * Each inclusion consumes (#undefs) them. */
#define NAME(f) KERNEL_NAME(f, SUFFIX)
#define WORD_NAME(f) KERNEL_NAME(f, WORD_SUFFIX)

void WORD_NAME(swap_nc)(const WORD *src, WORD *dst, int64_t N, int64_t P, int64_t C, int threads) {
    #pragma omp parallel for num_threads(threads) collapse(2) schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += TILE)
        for (int64_t p = 0; p < P; p++)
            for (int64_t n0 = 0; n0 < N; n0 += TILE) {
                int64_t c1 = c0 + TILE < C ? c0 + TILE : C, n1 = n0 + TILE < N ? n0 + TILE : N;
                for (int64_t c = c0; c < c1; c++)
                    for (int64_t n = n0; n < n1; n++)
                        dst[(c * P + p) * N + n] = src[(n * P + p) * C + c];
            }
}

/* acc (C floats) += the shares of pixel (y, x) of image n: gc[n, i, j, y - i, x - j] for each
 * window (i, j) that holds it. */
static inline void NAME(col2im_gather)(const T *restrict gc, float *restrict acc, int64_t n, int64_t y, int64_t x,
                                       int64_t OH, int64_t OW, int64_t C, int64_t K) {
    const int64_t i0 = y - K + 1 > 0 ? y - K + 1 : 0, i1 = y < OH - 1 ? y : OH - 1;
    const int64_t j0 = x - K + 1 > 0 ? x - K + 1 : 0, j1 = x < OW - 1 ? x : OW - 1;
    for (int64_t i = i0; i <= i1; i++)
        for (int64_t j = j0; j <= j1; j++) {
            const T *restrict s = gc + ((((n * OH + i) * OW + j) * K + (y - i)) * K + (x - j)) * C;
            #pragma omp simd
            for (int64_t c = 0; c < C; c++) acc[c] += LOAD(s[c]);
        }
}

/* gc (N, OH, OW, K, K, C) -> gx (N, H, W, C), OH = H - K + 1, OW = W - K + 1: each pixel summed
 * in fp32 in its thread's C floats (a 64-byte-aligned slice of sums: no false sharing), then
 * written once. Returns 1 when out of memory. */
int NAME(col2im)(const T *restrict gc, T *restrict gx, int64_t N, int64_t H, int64_t W, int64_t C, int64_t K,
                 int threads) {
    const int64_t OH = H - K + 1, OW = W - K + 1;
    if (threads < 1) threads = 1;
    const int64_t stride = (C / 16 + 1) * 16;  /* floats per thread: whole cache lines, one at least */
    float *sums = aligned_alloc(64, (size_t)threads * stride * sizeof(float));
    if (!sums) return 1;
    #pragma omp parallel num_threads(threads)
    {
        float *restrict acc = __builtin_assume_aligned(sums + omp_get_thread_num() * stride, 64);
        #pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++)
            for (int64_t y = 0; y < H; y++)
                for (int64_t x = 0; x < W; x++) {
                    #pragma omp simd
                    for (int64_t c = 0; c < C; c++) acc[c] = 0.f;
                    NAME(col2im_gather)(gc, acc, n, y, x, OH, OW, C, K);
                    T *restrict d = gx + ((n * H + y) * W + x) * C;
                    #pragma omp simd
                    for (int64_t c = 0; c < C; c++) d[c] = STORE(acc[c]);
                }
    }
    free(sums);
    return 0;
}

#undef NAME
#undef WORD_NAME
#undef T
#undef LOAD
#undef STORE
#undef SUFFIX
#undef WORD
#undef WORD_SUFFIX
