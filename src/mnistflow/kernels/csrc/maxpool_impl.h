/* The max-pool kernels for one element type, included by maxpool.c once per type with
 *   T, LOAD, NEG_INF  the stored type, its value as a float, and its -inf (the forward);
 *   WORD              the unsigned integer of T's size (the backward only moves bits);
 *   SUFFIX, WORD_SUFFIX  the names' suffixes: NAME(f) is f_SUFFIX, WORD_NAME(f) f_WORD_SUFFIX.
 * Each inclusion consumes (#undefs) them. */
#define NAME(f) KERNEL_NAME(f, SUFFIX)
#define WORD_NAME(f) KERNEL_NAME(f, WORD_SUFFIX)

static inline void NAME(max4)(const T *restrict a, const T *restrict b, const T *restrict c,
                              const T *restrict d, T *restrict y, uint8_t *restrict code, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        float m = LOAD(a[k]), vb = LOAD(b[k]), vc = LOAD(c[k]), vd = LOAD(d[k]);
        T mt = a[k];
        uint8_t i = 0;
        if (vb > m || vb != vb) { m = vb; mt = b[k]; i = 1; }
        if (vc > m || vc != vc) { m = vc; mt = c[k]; i = 2; }
        if (vd > m || vd != vd) { m = vd; mt = d[k]; i = 3; }
        y[k] = mt;
        code[k] = i;
    }
}

/* y (N, OH, OW, C) and code (N, OH, OW, C): code = dy * 2 + dx of the winner. A window cut by
   the edge (odd sizes, ceil mode) reads -inf for its missing inputs: they never win, as in
   PyTorch, which does not visit them. Returns 1 when out of memory. */
int NAME(maxpool2x2_forward)(const T *x, T *y, uint8_t *code, int64_t N, int64_t H, int64_t W, int64_t C,
                             int threads) {
    const int64_t OH = (H + 1) / 2, OW = (W + 1) / 2;
    T *none = malloc((size_t)C * sizeof(T));
    if (!none) return 1;
    for (int64_t k = 0; k < C; k++) none[k] = NEG_INF;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t oh = 0; oh < OH; oh++) {
            const int64_t h0 = 2 * oh, h1 = h0 + 1;
            for (int64_t ow = 0; ow < OW; ow++) {
                const int64_t w0 = 2 * ow, w1 = w0 + 1;
                const T *a = x + ((n * H + h0) * W + w0) * C;
                const T *b = w1 < W ? x + ((n * H + h0) * W + w1) * C : none;
                const T *c = h1 < H ? x + ((n * H + h1) * W + w0) * C : none;
                const T *d = h1 < H && w1 < W ? x + ((n * H + h1) * W + w1) * C : none;
                const int64_t o = ((n * OH + oh) * OW + ow) * C;
                int64_t k = 0;
                for (; k + 16 <= C; k += 16)
                    NAME(max4)(a + k, b + k, c + k, d + k, y + o + k, code + o + k, 16);
                NAME(max4)(a + k, b + k, c + k, d + k, y + o + k, code + o + k, C - k);
            }
        }
    free(none);
    return 0;
}

static inline void WORD_NAME(pick)(const WORD *restrict g, const uint8_t *restrict code, WORD *restrict out,
                                   uint8_t want, int64_t n) {
    for (int64_t k = 0; k < n; k++) out[k] = g[k] & (WORD)-(WORD)(code[k] == want);
}

/* gx (N, H, W, C), every element written once: g where the code points at it, else 0. */
void WORD_NAME(maxpool2x2_backward)(const WORD *g, const uint8_t *code, WORD *gx, int64_t N, int64_t H,
                                    int64_t W, int64_t C, int threads) {
    const int64_t OH = (H + 1) / 2, OW = (W + 1) / 2;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++) {
                const int64_t i = ((n * OH + h / 2) * OW + w / 2) * C;
                const uint8_t want = (uint8_t)((h & 1) * 2 + (w & 1));
                WORD *out = gx + ((n * H + h) * W + w) * C;
                int64_t k = 0;
                for (; k + 16 <= C; k += 16) WORD_NAME(pick)(g + i + k, code + i + k, out + k, want, 16);
                WORD_NAME(pick)(g + i + k, code + i + k, out + k, want, C - k);
            }
}

#undef NAME
#undef WORD_NAME
#undef T
#undef LOAD
#undef NEG_INF
#undef SUFFIX
#undef WORD
#undef WORD_SUFFIX
