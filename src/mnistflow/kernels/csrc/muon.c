/* Muon's Newton-Schulz orthogonalization with bf16 products: on the AMX matrix engine, or on
 * AVX-512-BF16's vdpbf16ps where the CPU has no AMX (Zen 4 and 5).
 *
 * For each weight matrix X (rows <= cols, fp32, normalized first to Frobenius norm 1):
 *     S = X X^T,  M = b S + c S S,  X = a X + M X        (three times; a, b, c: Jordan et al.)
 * PyTorch ran the three small products of each step as separate fp32 calls (the fast net's
 * three matrices: 27 calls and ~0.7 ms per training step); here each matrix is one call with
 * bf16 products accumulated in fp32, X kept in fp32 between steps. On AMX the matrices of a
 * step are spread over the threads (one matrix's products are short on the tiles); on the
 * vector path each product's 16 x 16 blocks are (the fast net's 192 x 432 matrix is 96% of its
 * multiply-adds, so one thread per matrix would leave the other idle).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mnistflow_kernels.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__linux__)
#define MUON_VECTOR 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define MUON_TILES 1
#endif
#endif

#ifdef MUON_VECTOR
#include <omp.h>

#include "vnni.h"
#ifdef MUON_TILES
#include "amx.h"
#endif

static inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* B tiles (KT x NB) in VNNI pairs from a row-major bf16 matrix b (rows k, ld ldb), rows at and
 * past krows read as 0: out[((kt * NB + nb) * 16 + j) * 32 + 2 i + h] = b[32 kt + 2 j + h][16 nb + i]. */
static void pack_rows(const uint16_t *b, int64_t ldb, int64_t krows, int64_t KT, int64_t NB, uint16_t *out,
                      int threads) {
    _Pragma("omp parallel for collapse(2) num_threads(threads) if(threads > 1)")
    for (int64_t kt = 0; kt < KT; kt++)
        for (int64_t nb = 0; nb < NB; nb++)
            for (int64_t j = 0; j < 16; j++) {
                const int64_t k = kt * 32 + 2 * j;
                const __m256i va = k < krows ? _mm256_loadu_si256((const __m256i *)(b + k * ldb + nb * 16))
                                             : _mm256_setzero_si256();
                const __m256i vb = k + 1 < krows ? _mm256_loadu_si256((const __m256i *)(b + (k + 1) * ldb + nb * 16))
                                                 : _mm256_setzero_si256();
                _mm512_storeu_si512(out + ((kt * NB + nb) * 16 + j) * 32, interleave16(va, vb));
            }
}

/* B tiles of a^T for a row-major bf16 a (R x K, ld lda; R % 16 == 0, K % 32 == 0): the pairs
 * a[n][2 j], a[n][2 j + 1] are one 32-bit word, so each tile is a 16 x 16 word transpose. */
static void pack_transposed(const uint16_t *a, int64_t lda, int64_t R, int64_t K, uint16_t *out, int threads) {
    const int64_t KT = K / 32, NB = R / 16;
    _Pragma("omp parallel for collapse(2) num_threads(threads) if(threads > 1)")
    for (int64_t kt = 0; kt < KT; kt++)
        for (int64_t nb = 0; nb < NB; nb++) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(a + (nb * 16 + i) * lda + kt * 32);
            transpose16x16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(out + ((kt * NB + nb) * 16 + j) * 32, r[j]);
        }
}

/* c (M x N fp32, ld ldc) = a (M x K bf16, ld lda) . B (packed, KT x NB tiles); M % 16 == 0.
 * tiles: on AMX (the caller configured them); else vdpbf16ps, each 8-row x 32-column block of c
 * (two B tiles side by side) in 16 fp32 registers (row r += A[r]'s pair q broadcast . B's pair
 * row q: one broadcast feeds two products), the blocks over `threads`; where the product is
 * symmetric (sym: S = X X^T, S S) only the 16 x 16 blocks on and above the diagonal, the others
 * copied. */
static void gemm(const uint16_t *a, int64_t lda, const uint16_t *bt, float *c, int64_t ldc, int64_t M,
                 int64_t KT, int64_t NB, int sym, int tiles, int threads) {
#ifdef MUON_TILES
    if (tiles) {
        for (int64_t mb = 0; mb < M / 16; mb++)
            for (int64_t nb = 0; nb < NB; nb++) {
                _tile_zero(0);
                for (int64_t kt = 0; kt < KT; kt++) {
                    _tile_loadd(1, a + mb * 16 * lda + kt * 32, lda * 2);
                    _tile_loadd(2, bt + (kt * NB + nb) * 512, 64);
                    _tile_dpbf16ps(0, 1, 2);
                }
                _tile_stored(0, c + mb * 16 * ldc + nb * 16, ldc * 4);
            }
        return;
    }
#endif
    (void)tiles;
    const int64_t groups = M / 8, pairs = (NB + 1) / 2, blocks = groups * pairs;
    _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 2) if(threads > 1 && blocks > 1)")
    for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t g = blk / pairs, nb = blk % pairs * 2, two = nb + 1 < NB;
        if (sym && nb + 1 < g / 2) continue;  /* both column blocks below the diagonal */
        __m512 s0[8], s1[8];
        for (int r = 0; r < 8; r++) s0[r] = s1[r] = _mm512_setzero_ps();
        for (int64_t kt = 0; kt < KT; kt++) {
            const uint16_t *ar = a + g * 8 * lda + kt * 32, *b0 = bt + (kt * NB + nb) * 512, *b1 = b0 + 512;
            for (int q = 0; q < 16; q++) {
                const __m512bh bq0 = (__m512bh)_mm512_loadu_si512(b0 + q * 32);
                const __m512bh bq1 = two ? (__m512bh)_mm512_loadu_si512(b1 + q * 32) : bq0;
                for (int r = 0; r < 8; r++) {
                    int32_t pair;
                    memcpy(&pair, ar + r * lda + 2 * q, sizeof pair);
                    const __m512bh ap = (__m512bh)_mm512_set1_epi32(pair);
                    s0[r] = _mm512_dpbf16_ps(s0[r], ap, bq0);
                    s1[r] = _mm512_dpbf16_ps(s1[r], ap, bq1);  /* (discarded when !two) */
                }
            }
        }
        for (int r = 0; r < 8; r++) {
            float *row = c + (g * 8 + r) * ldc + nb * 16;
            _mm512_storeu_ps(row, s0[r]);
            if (two) _mm512_storeu_ps(row + 16, s1[r]);
        }
    }
    if (sym)  /* below the diagonal: the transpose of what is above it */
        for (int64_t i = 16; i < M; i++)
            for (int64_t j = 0; j < i / 16 * 16; j++) c[i * ldc + j] = c[j * ldc + i];
}

/* dst (bf16, ld ldd) = src (fp32, ld lds), rounded to nearest even, 16 at a time. */
static void to_bf16(const float *src, int64_t lds, uint16_t *dst, int64_t ldd, int64_t rows, int64_t cols,
                   int threads) {
    _Pragma("omp parallel for num_threads(threads) if(threads > 1)")
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j += 16) {
            const __mmask16 m = cols - j >= 16 ? 0xFFFF : (__mmask16)((1u << (cols - j)) - 1);
            const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i * lds + j));
            _mm256_mask_storeu_epi16(dst + i * ldd + j, m, (__m256i)v);
        }
}

/* One matrix, in place: x (rows x cols fp32, row-major, rows <= cols); products on the tiles
 * (tiles 1) or vdpbf16ps over `threads` (tiles 0). Returns 1 when out of memory. */
static int newton_schulz(float *x, int64_t rows, int64_t cols, int steps, int tiles, int threads) {
    const float ca = 3.4445f, cb = -4.7750f, cc = 2.0315f;
    const int64_t R = round_up(rows, 16), R32 = round_up(rows, 32), K = round_up(cols, 32);
    const int64_t N = round_up(cols, 16);
    const int64_t BT = K * R > R32 * N ? K * R : R32 * N;  /* packed B: X^T's tiles, S's, then X's */
    /* xb (R x K) bf16 X; sb, mbuf (R x R32) bf16 S and M; s, ss (R x R), y (R x N) fp32 */
    const size_t bytes = (size_t)R * K * 2 + 2 * (size_t)R * R32 * 2 + 2 * (size_t)R * R * 4 + (size_t)R * N * 4
                         + (size_t)BT * 2 + 64 * 7;
    char *mem = aligned_alloc(64, round_up((int64_t)bytes, 64));
    if (!mem) return 1;
    memset(mem, 0, bytes);  /* every padding row and column is 0, and stays 0 */
    char *p = mem;
#define TAKE(T, name, n) T *name = (T *)p; p += round_up((int64_t)((n) * sizeof(T)), 64);
    TAKE(uint16_t, xb, R * K)
    TAKE(uint16_t, sb, R * R32)
    TAKE(uint16_t, mbuf, R * R32)
    TAKE(float, s, R * R)
    TAKE(float, ss, R * R)
    TAKE(float, y, R * N)
    TAKE(uint16_t, bt, BT)
#undef TAKE
    double norm = 0;
    _Pragma("omp simd reduction(+:norm)")  /* in vector lanes: a serial chain of double adds */
    for (int64_t i = 0; i < rows * cols; i++) norm += (double)x[i] * x[i];
    const float scale = (float)(1.0 / (sqrt(norm) + 1e-7));
    for (int64_t i = 0; i < rows * cols; i++) x[i] *= scale;
#ifdef MUON_TILES
    if (tiles) configure_tiles();
#endif
    for (int step = 0; step < steps; step++) {
        to_bf16(x, cols, xb, K, rows, cols, threads);
        pack_transposed(xb, K, R, K, bt, threads);              /* S = X X^T (symmetric) */
        gemm(xb, K, bt, s, R, R, K / 32, R / 16, 1, tiles, threads);
        to_bf16(s, R, sb, R32, R, R, threads);
        pack_rows(sb, R32, R, R32 / 32, R / 16, bt, threads);   /* S S (S is symmetric) */
        gemm(sb, R32, bt, ss, R, R, R32 / 32, R / 16, 1, tiles, threads);
        _Pragma("omp parallel for num_threads(threads) if(threads > 1)")
        for (int64_t i = 0; i < R * R; i++) ss[i] = cb * s[i] + cc * ss[i];  /* M = b S + c S S */
        to_bf16(ss, R, mbuf, R32, R, R, threads);
        pack_rows(xb, K, R, R32 / 32, N / 16, bt, threads);     /* M X */
        gemm(mbuf, R32, bt, y, N, R, R32 / 32, N / 16, 0, tiles, threads);
        _Pragma("omp parallel for num_threads(threads) if(threads > 1)")
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) x[i * cols + j] = ca * x[i * cols + j] + y[i * N + j];
    }
#ifdef MUON_TILES
    if (tiles) _tile_release();
#endif
    free(mem);
    return 0;
}

/* count matrices xs[i] (rows[i] x cols[i], rows <= cols), orthogonalized in place: on AMX
 * (tiles 1; the caller has amx_request's permission) the matrices spread over the threads, on
 * AVX-512-BF16 (tiles 0) one after another, each product over the threads. Returns 0; 1 when
 * out of memory; -1 when this build has no such path. */
int newton_schulz_bf16(int count, float **xs, const int64_t *rows, const int64_t *cols, int steps, int threads,
                       int tiles) {
#ifndef MUON_TILES
    if (tiles) return -1;
#endif
    if (threads < 1) threads = 1;
    int failed = 0;
    if (tiles) {
        _Pragma("omp parallel for num_threads(threads) schedule(dynamic) reduction(|:failed)")
        for (int i = 0; i < count; i++) failed |= newton_schulz(xs[i], rows[i], cols[i], steps, 1, 1);
    } else {
        for (int i = 0; i < count; i++) {  /* a small matrix on one thread: ~11 barriers per step cost more */
            const int small = rows[i] * rows[i] * cols[i] < (1 << 21);  /* multiply-adds of S = X X^T */
            failed |= newton_schulz(xs[i], rows[i], cols[i], steps, 0, small ? 1 : threads);
        }
    }
    return failed;
}

#else

int newton_schulz_bf16(int count, float **xs, const int64_t *rows, const int64_t *cols, int steps, int threads,
                       int tiles) {
    (void)count; (void)xs; (void)rows; (void)cols; (void)steps; (void)threads; (void)tiles;
    return -1;
}

#endif
