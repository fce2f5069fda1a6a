#define _GNU_SOURCE
/* Weight gradient of a 3x3, stride-1, padding-1 convolution on channels-last bf16 tensors,
 * on the AMX matrix engine.
 *
 * dW[o][kh][kw][c] = sum over pixels p = (n, y, x) of g[p][o] * x[n][y+kh-1][x+kw-1][c]
 *
 * is one matrix product with a long reduction: (O x K) . (K x 9C), K = N*H*W pixels (18,816
 * for the fast net's 7x7 stage at batch 384) and both other sides small (16-96). oneDNN's
 * backward-weights kernel ran such shapes at 3-4x the time of the forward convolution of the
 * same FLOPs. Here each thread takes a share of the pixels in chunks that stay in its L2:
 *   A = g transposed, tiles of 16 output channels x 32 pixels;
 *   B = the shifted inputs ("im2col" rows, never materialized whole) in AMX's pair-interleaved
 *       (VNNI) layout, tiles of 16 pixel pairs x 16 columns of (kh, kw, c);
 * and accumulates C = A . B in fp32 tiles; the threads' sums are added at the end.
 *
 * For a net's first layer, a convolution followed by a 2x2 max-pool, two more entry points:
 * the forward of both at once (conv3x3_maxpool_forward_bf16, 3C <= 16), and the weight
 * gradient from the pool's gradient and winner codes (conv3x3_maxpool_wgrad_bf16), so the
 * convolution's full-size output and gradient never exist.
 *
 * The product runs on AMX tiles (tiles = 1), or, on CPUs with AVX-512-BF16 but no AMX (Zen 4
 * and 5; tiles = 0), on vdpbf16ps from the same packed chunks: each tile product becomes 16
 * rows x 16 pixel pairs of broadcast-and-multiply into 16 fp32 registers. oneDNN's kernel ran
 * the fast net's 7x7 stage at 1.7x its forward's time on a Zen 4.
 *
 * The weight gradients are built where the compiler targets AVX-512-BF16 (-march=native on such
 * a CPU), their AMX path and the first layer's fused forward where it targets AMX too; elsewhere
 * those entry points return -1 and the caller uses PyTorch's ops.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mnistflow_kernels.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__linux__)
#define WGRAD_VECTOR 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define WGRAD_TILES 1
#endif
#endif

#ifdef WGRAD_VECTOR
#include <omp.h>

#include "vnni.h"
#ifdef WGRAD_TILES
#include "amx.h"
#endif

#define KC 512  /* pixels per chunk, a multiple of 32: A and B tiles of a chunk fit in L2 */

/* Walks pixels p0, p0 + 1, ... keeping (n, y, x) without a division per pixel. */
typedef struct { int64_t p, n, y, x; } cursor;

static inline cursor cursor_at(int64_t p, int64_t H, int64_t W) {
    const int64_t yx = p % (H * W);
    return (cursor){p, p / (H * W), yx / W, yx % W};
}

static inline void cursor_next(cursor *c, int64_t H, int64_t W) {
    c->p++;
    if (++c->x == W) {
        c->x = 0;
        if (++c->y == H) {
            c->y = 0;
            c->n++;
        }
    }
}

/* Where the output gradient g (N, H, W, O) comes from: g itself, or (pooled) the gradient gp of
 * a following 2x2 max-pool (N, ceil(H/2), ceil(W/2), O) and its winner codes (dy * 2 + dx, one
 * byte each): g is gp at the window's winner and 0 elsewhere, never written out. */
typedef struct {
    const uint16_t *g, *gp;
    const uint8_t *code;
} grad_source;

/* 16 output channels [o0, o0 + 16) of g at the cursor's pixel (0 past the last), then steps. */
static inline __m256i grad_row(const grad_source *s, cursor *c, int64_t P, int64_t H, int64_t W,
                               int64_t O, int64_t o0) {
    __m256i v = _mm256_setzero_si256();
    if (c->p < P) {
        if (!s->gp) {
            v = _mm256_loadu_si256((const __m256i *)(s->g + c->p * O + o0));
        } else {
            const int64_t OH = (H + 1) / 2, OW = (W + 1) / 2;
            const int64_t i = ((c->n * OH + c->y / 2) * OW + c->x / 2) * O + o0;
            const __m128i want = _mm_set1_epi8((char)((c->y & 1) * 2 + (c->x & 1)));
            const __mmask16 won = _mm_cmpeq_epi8_mask(_mm_loadu_si128((const __m128i *)(s->code + i)), want);
            v = _mm256_maskz_loadu_epi16(won, s->gp + i);
        }
    }
    return v;
}

/* A tiles for pixels [p0, p0 + KC): at[mb][kb][r][j] = g[p0 + 32 kb + j][16 mb + r], 0 past P.
 * Pixel pairs are interleaved first (16 words per pair, one per channel), then the 16 pairs x
 * 16 channels of words are transposed: each tile row is one channel's 32 pixels. */
static void pack_a(const grad_source *s, uint16_t *at, int64_t p0, int64_t P, int64_t H, int64_t W,
                   int64_t O) {
    const int64_t MB = O / 16, KB = KC / 32;
    __m512i r[16];
    for (int64_t kb = 0; kb < KB; kb++)
        for (int64_t mb = 0; mb < MB; mb++) {
            cursor c = cursor_at(p0 + kb * 32, H, W);  /* one division per tile */
            for (int q = 0; q < 16; q++) {
                const __m256i va = grad_row(s, &c, P, H, W, O, mb * 16);
                cursor_next(&c, H, W);
                const __m256i vb = grad_row(s, &c, P, H, W, O, mb * 16);
                cursor_next(&c, H, W);
                r[q] = interleave16(va, vb);
            }
            transpose16x16(r);
            uint16_t *dst = at + ((mb * KB + kb) * 16) * 32;
            for (int q = 0; q < 16; q++) _mm512_storeu_si512((void *)(dst + q * 32), r[q]);
        }
}

/* B tiles for pixels [p0, p0 + KC): bt[nb][kb][r][2 j + i] = col[p0 + 32 kb + 2 r + i][16 nb + j],
 * col[p][(kh * 3 + kw) * C + c] = x under tap (kh, kw) of p, channel c; zero past 9C and P. */
static void pack_b(const uint16_t *x, uint16_t *bt, int64_t p0, int64_t P, int64_t H, int64_t W,
                   int64_t C) {
    const int64_t KB = KC / 32;
    if (C % 16 == 0) {  /* each 16-column block is one tap's 16 channels; tap by tap */
        const int64_t CB = C / 16;
        static const int16_t ilo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
        static const int16_t ihi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                        24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
        const __m512i lo = _mm512_loadu_si512(ilo), hi = _mm512_loadu_si512(ihi);
        const cursor start = cursor_at(p0, H, W);
        for (int t = 0; t < 9; t++) {
            const int64_t dy = t / 3 - 1, dx = t % 3 - 1, off = (dy * W + dx) * C;
            cursor c = start;
            uint16_t *dst = bt + t * CB * KB * 512;  /* tiles (t, cb, kb): rows of pixel pairs */
            for (int64_t pair = 0; pair < KC / 2; pair++, dst += 32) {
                const uint16_t *src[2];
                for (int i = 0; i < 2; i++) {
                    const int64_t yy = c.y + dy, xx = c.x + dx;
                    src[i] = c.p < P && yy >= 0 && yy < H && xx >= 0 && xx < W ? x + c.p * C + off : NULL;
                    cursor_next(&c, H, W);
                }
                int64_t cb = 0;
                for (; cb + 2 <= CB; cb += 2) {  /* 32 channels per load */
                    __m512i va = src[0] ? _mm512_loadu_si512(src[0] + cb * 16) : _mm512_setzero_si512();
                    __m512i vb = src[1] ? _mm512_loadu_si512(src[1] + cb * 16) : _mm512_setzero_si512();
                    _mm512_storeu_si512((void *)(dst + cb * KB * 512), _mm512_permutex2var_epi16(va, lo, vb));
                    _mm512_storeu_si512((void *)(dst + (cb + 1) * KB * 512), _mm512_permutex2var_epi16(va, hi, vb));
                }
                if (cb < CB) {
                    __m256i va = src[0] ? _mm256_loadu_si256((const __m256i *)(src[0] + cb * 16))
                                        : _mm256_setzero_si256();
                    __m256i vb = src[1] ? _mm256_loadu_si256((const __m256i *)(src[1] + cb * 16))
                                        : _mm256_setzero_si256();
                    _mm512_storeu_si512((void *)(dst + cb * KB * 512), interleave16(va, vb));
                }
            }
        }
        return;
    }
    /* 3C <= 16 (the fast net's first stage: 4 space-to-depth channels): one 16-column block per
     * kernel row kh, holding the 3C contiguous input values under (kh, 0..2) and zeros; the
     * columns of the edge taps are masked off at the image's left and right borders. */
    const uint32_t row_mask = (1u << (3 * C)) - 1, left = (1u << C) - 1, right = left << (2 * C);
    cursor c = cursor_at(p0, H, W);
    for (int64_t pair = 0; pair < KC / 2; pair++) {
        __m256i v[2][3];
        for (int i = 0; i < 2; i++) {
            for (int kh = 0; kh < 3; kh++) {
                const int64_t yy = c.y + kh - 1;
                __mmask16 m = c.p < P && yy >= 0 && yy < H ? row_mask : 0;
                if (c.x == 0) m &= ~left;
                if (c.x == W - 1) m &= ~right;
                /* masked-off elements are not read: no fault before the first or past the last pixel */
                v[i][kh] = _mm256_maskz_loadu_epi16(m, x + (c.p + (kh - 1) * W - 1) * C);
            }
            cursor_next(&c, H, W);
        }
        const int64_t kb = pair / 16, r = pair % 16;
        for (int kh = 0; kh < 3; kh++)
            _mm512_storeu_si512((void *)(bt + ((kh * KB + kb) * 16 + r) * 32), interleave16(v[0][kh], v[1][kh]));
    }
}

#ifdef WGRAD_TILES
/* acc (O x NC, fp32) += A . B over the chunk, for A's row blocks in groups of up to 6 (tiles
 * 0-5 accumulate, 6 holds B, 7 holds A). Tile numbers are immediates, hence the unrolled
 * blocks. */
#define DOT(i)                                                                                 \
    if (MG > i) {                                                                              \
        _tile_loadd(7, a + ((i * KB + kb) * 16) * 32, 64);                                     \
        _tile_dpbf16ps(i, 7, 6);                                                               \
    }
#define LOAD_C(i) if (MG > i) _tile_loadd(i, c + (i * 16) * NC + nb * 16, NC * 4);
#define STORE_C(i) if (MG > i) _tile_stored(i, c + (i * 16) * NC + nb * 16, NC * 4);

static void multiply_tiles(const uint16_t *at, const uint16_t *bt, float *acc, int64_t MB, int64_t NB) {
    const int64_t KB = KC / 32, NC = NB * 16;
    for (int64_t m0 = 0; m0 < MB; m0 += 6) {
        const int64_t MG = MB - m0 < 6 ? MB - m0 : 6;
        const uint16_t *a = at + m0 * KB * 512;
        float *c = acc + m0 * 16 * NC;
        for (int64_t nb = 0; nb < NB; nb++) {
            LOAD_C(0) LOAD_C(1) LOAD_C(2) LOAD_C(3) LOAD_C(4) LOAD_C(5)
            for (int64_t kb = 0; kb < KB; kb++) {
                _tile_loadd(6, bt + ((nb * KB + kb) * 16) * 32, 64);
                DOT(0) DOT(1) DOT(2) DOT(3) DOT(4) DOT(5)
            }
            STORE_C(0) STORE_C(1) STORE_C(2) STORE_C(3) STORE_C(4) STORE_C(5)
        }
    }
}
#endif

/* The same product with AVX-512-BF16: for each 16 x 16 block of acc (16 rows of A, one B tile
 * column block), 16 fp32 registers; per pixel pair q, one B row (16 columns' pairs) and each A
 * row's pair broadcast: acc[r] += A[r][q] . B[q] (vdpbf16ps sums the pair's two products). */
static void multiply_vector(const uint16_t *at, const uint16_t *bt, float *acc, int64_t MB, int64_t NB) {
    const int64_t KB = KC / 32, NC = NB * 16;
    for (int64_t mb = 0; mb < MB; mb++)
        for (int64_t nb = 0; nb < NB; nb++) {
            float *c = acc + mb * 16 * NC + nb * 16;
            __m512 s[16];
            for (int r = 0; r < 16; r++) s[r] = _mm512_loadu_ps(c + r * NC);
            for (int64_t kb = 0; kb < KB; kb++) {
                const uint16_t *a = at + ((mb * KB + kb) * 16) * 32;  /* 16 rows x 16 pairs */
                const uint16_t *b = bt + ((nb * KB + kb) * 16) * 32;  /* 16 pairs x 16 columns */
                for (int q = 0; q < 16; q++) {
                    const __m512bh bq = (__m512bh)_mm512_loadu_si512(b + q * 32);
                    for (int r = 0; r < 16; r++) {
                        int32_t pair;
                        memcpy(&pair, a + r * 32 + 2 * q, sizeof pair);
                        s[r] = _mm512_dpbf16_ps(s[r], (__m512bh)_mm512_set1_epi32(pair), bq);
                    }
                }
            }
            for (int r = 0; r < 16; r++) _mm512_storeu_ps(c + r * NC, s[r]);
        }
}

static int wgrad(const uint16_t *x, const grad_source *src, float *dw, int64_t N, int64_t H, int64_t W,
                 int64_t C, int64_t O, int threads, int tiles) {
#ifndef WGRAD_TILES
    if (tiles) return -1;
#endif
    const int rows = 3 * C <= 16;  /* one column block per kernel row (pack_b) */
    if (O % 16 || !(rows || C % 16 == 0)) return 2;
    const int64_t P = N * H * W, MB = O / 16, NB = rows ? 3 : 9 * C / 16, NC = NB * 16;
    const int64_t chunks = (P + KC - 1) / KC;
    if (threads < 1) threads = 1;
    if (threads > chunks) threads = (int)chunks;
    float *acc = aligned_alloc(64, (size_t)threads * O * NC * sizeof(float));
    if (!acc) return 1;
    memset(acc, 0, (size_t)threads * O * NC * sizeof(float));
    int failed = 0;
    _Pragma("omp parallel num_threads(threads) reduction(|:failed)")
    {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        uint16_t *at = aligned_alloc(64, (size_t)O * KC * sizeof(uint16_t));
        uint16_t *bt = aligned_alloc(64, (size_t)NC * KC * sizeof(uint16_t));
        if (!at || !bt) {
            failed = 1;
        } else {
            float *mine = acc + (int64_t)t * O * NC;
#ifdef WGRAD_TILES
            if (tiles) configure_tiles();
#endif
            for (int64_t ch = chunks * t / T; ch < chunks * (t + 1) / T; ch++) {
                pack_a(src, at, ch * KC, P, H, W, O);
                pack_b(x, bt, ch * KC, P, H, W, C);
#ifdef WGRAD_TILES
                if (tiles) {
                    multiply_tiles(at, bt, mine, MB, NB);
                    continue;
                }
#endif
                multiply_vector(at, bt, mine, MB, NB);
            }
#ifdef WGRAD_TILES
            if (tiles) _tile_release();
#endif
        }
        free(at);
        free(bt);
    }
    if (!failed)
        for (int64_t o = 0; o < O; o++)
            for (int64_t j = 0; j < 9 * C; j++) {  /* j = (kh * 3 + kw) * C + c */
                const int64_t col = rows ? j / (3 * C) * 16 + j % (3 * C) : j;
                float s = 0;
                for (int t = 0; t < threads; t++) s += acc[((int64_t)t * O + o) * NC + col];
                dw[o * 9 * C + j] = s;
            }
    free(acc);
    return failed;
}

/* x (N, H, W, C) and g (N, H, W, O) bf16 bits; dw (O, 3, 3, C) fp32. O a multiple of 16; C a
 * multiple of 16 or at most 5; tiles: 1 AMX (the caller has amx_request's permission), 0
 * AVX-512-BF16. Returns 0; 1 when out of memory; 2 for other shapes; -1 when this build has no
 * such path. */
int conv3x3_wgrad_bf16(const uint16_t *x, const uint16_t *g, float *dw, int64_t N, int64_t H,
                       int64_t W, int64_t C, int64_t O, int threads, int tiles) {
    const grad_source src = {g, NULL, NULL};
    return wgrad(x, &src, dw, N, H, W, C, O, threads, tiles);
}

/* The same for a convolution followed by a 2x2 max-pool (ceil mode): gp (N, ceil(H/2),
 * ceil(W/2), O) is the pool's output gradient and code its winners (the max-pool kernel's). */
int conv3x3_maxpool_wgrad_bf16(const uint16_t *x, const uint16_t *gp, const uint8_t *code, float *dw,
                               int64_t N, int64_t H, int64_t W, int64_t C, int64_t O, int threads, int tiles) {
    const grad_source src = {NULL, gp, code};
    return wgrad(x, &src, dw, N, H, W, C, O, threads, tiles);
}
#endif /* WGRAD_VECTOR */

#ifdef WGRAD_TILES
int amx_request(void) { return amx_permission(); }  /* 0: this process may use the tiles */

/* ---- the forward of a first layer: y = maxpool2x2(conv3x3(x, w)), 3C <= 16 ------------------
 * For the fast net's 4 space-to-depth channels oneDNN's convolution wrote a 4.8 MB output per
 * step that the pool then read back. Here each block of 16 output pixels (8 columns of two
 * rows, i.e. 4 pooling windows) is one AMX product: A = the pixels' 3 kernel rows (one
 * 16-column block per kernel row: its 3C inputs, then inputs that meet zero weights; K = 48
 * of 64), B = the weights in VNNI pairs, C = 16 pixels x 16 channels in fp32; the pool reads
 * C from the L1, rounds to bf16 (as oneDNN's output does) and keeps the maximum and its
 * winner code (the max-pool kernel's). */

/* The forward's sizes: x (N, H, W, C), y (N, OH, OW, O) in OB blocks of 16 channels; XB blocks
 * of 8 columns per pooled row; each image copied into a zero-bordered scratch of Wp columns,
 * pad_elems elements. */
typedef struct {
    int64_t H, W, C, O, OB, OH, OW, XB, Wp, pad_elems;
} first_layer;

/* B tiles (kt, ob): bw[((kt * OB + ob) * 16 + r) * 32 + 2 j + i] = w[16 ob + j][k], k = 32 kt
   + 2 r + i = 16 kh + kw * C + c: column kw * C + c of kernel row kh, as the A rows hold them;
   0 elsewhere. w (O, C, 3, 3). */
static void pack_weights(const uint16_t *w, uint16_t *bw, int64_t C, int64_t O) {
    const int64_t OB = O / 16;
    memset(bw, 0, (size_t)2 * OB * 512 * sizeof(uint16_t));
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++)
            for (int kh = 0; kh < 3; kh++)
                for (int kw = 0; kw < 3; kw++) {
                    const int64_t k = kh * 16 + kw * C + c, kt = k / 32, r = (k % 32) / 2, i = k % 2;
                    bw[((kt * OB + o / 16) * 16 + r) * 32 + 2 * (o % 16) + i] = w[((o * C + c) * 3 + kh) * 3 + kw];
                }
}

/* Image n into the zero-bordered scratch: input pixel (y, x) at (y + 1, x + 1), rows and
   columns past the image 0, so a kernel row of any output pixel is one unmasked 16-element
   load: its 3C inputs, then inputs that meet zero weights. */
static void pad_image(first_layer s, const uint16_t *x, uint16_t *pad, int64_t n) {
    memset(pad, 0, (size_t)s.pad_elems * 2);
    for (int64_t yy = 0; yy < s.H; yy++)
        memcpy(pad + ((yy + 1) * s.Wp + 1) * s.C, x + (n * s.H + yy) * s.W * s.C, (size_t)(s.W * s.C) * 2);
}

/* Tiles 2 and 3 (staged in a): the A rows of the block of 16 output pixels at pooled row oy,
   columns [x0, x0 + 8): rows 0-7 (2 oy, x0 + r), rows 8-15 the row below; each pixel's kernel
   rows 0 and 1 in tile 2, kernel row 2 and zeros in tile 3. */
static void load_pixels(first_layer s, const uint16_t *pad, uint16_t a[2][16][32], int64_t oy, int64_t x0) {
    for (int r = 0; r < 16; r++) {
        const uint16_t *base = pad + ((2 * oy + r / 8) * s.Wp + x0 + r % 8) * s.C;
        const __m256i k0 = _mm256_loadu_si256((const __m256i *)base);
        const __m256i k1 = _mm256_loadu_si256((const __m256i *)(base + s.Wp * s.C));
        const __m256i k2 = _mm256_loadu_si256((const __m256i *)(base + 2 * s.Wp * s.C));
        _mm512_store_si512((void *)a[0][r], _mm512_inserti64x4(_mm512_castsi256_si512(k0), k1, 1));
        _mm512_store_si512((void *)a[1][r], _mm512_inserti64x4(_mm512_castsi256_si512(k2),
                                                               _mm256_setzero_si256(), 1));
    }
    _tile_loadd(2, a[0], 64);
    _tile_loadd(3, a[1], 64);
}

/* out (16 pixels x 16 channels, fp32) = tiles 2 and 3 (the block's pixels) times the weights'
   B tiles for output channels [16 ob, 16 ob + 16). */
static void multiply_block(const uint16_t *bw, int64_t OB, int64_t ob, float out[16][16]) {
    _tile_zero(0);
    _tile_loadd(4, bw + (0 * OB + ob) * 512, 64);
    _tile_loadd(5, bw + (1 * OB + ob) * 512, 64);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(0, 3, 5);
    _tile_stored(0, out, 64);
}

/* The block's pooling windows v (up to 4): out's pixels 2v, 2v + 1 and the two below, rounded
   to bf16 (the values the two-layer version compares); their maximum into y and its winner
   code (the max-pool kernel's) into code, channels [16 ob, 16 ob + 16). */
static void pool_block(first_layer s, float out[16][16], uint16_t *y, uint8_t *code, int64_t n, int64_t oy,
                       int64_t x0, int64_t ob) {
    for (int v = 0; v < 4; v++) {
        const int64_t ox = x0 / 2 + v;
        if (ox >= s.OW) break;
        const int64_t y0 = 2 * oy, xa = 2 * ox;
        const int ok[4] = {1, xa + 1 < s.W, y0 + 1 < s.H, y0 + 1 < s.H && xa + 1 < s.W};
        const int rows[4] = {2 * v, 2 * v + 1, 8 + 2 * v, 9 + 2 * v};
        __m512 m = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_load_ps(out[rows[0]])));
        __m128i win = _mm_setzero_si128();
        for (int q = 1; q < 4; q++) {
            if (!ok[q]) continue;
            const __m512 vq = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_load_ps(out[rows[q]])));
            const __mmask16 take = _mm512_cmp_ps_mask(vq, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(vq, vq, _CMP_UNORD_Q);
            m = _mm512_mask_mov_ps(m, take, vq);
            win = _mm_mask_mov_epi8(win, take, _mm_set1_epi8((char)q));
        }
        const int64_t i = ((n * s.OH + oy) * s.OW + ox) * s.O + ob * 16;
        _mm256_storeu_si256((__m256i *)(y + i), (__m256i)_mm512_cvtneps_pbh(m));
        if (code) _mm_storeu_si128((__m128i *)(code + i), win);  /* NULL: inference */
    }
}

/* Image n: for each block of 16 output pixels, its A tiles, then per 16 output channels the
   product and the pool. pad: this thread's scratch. */
static void forward_image(first_layer s, const uint16_t *x, const uint16_t *bw, uint16_t *pad, uint16_t *y,
                          uint8_t *code, int64_t n) {
    _Alignas(64) uint16_t a[2][16][32];
    _Alignas(64) float out[16][16];
    pad_image(s, x, pad, n);
    for (int64_t oy = 0; oy < s.OH; oy++)
        for (int64_t x0 = 0; x0 < s.XB * 8; x0 += 8) {
            load_pixels(s, pad, a, oy, x0);
            for (int64_t ob = 0; ob < s.OB; ob++) {
                multiply_block(bw, s.OB, ob, out);
                pool_block(s, out, y, code, n, oy, x0, ob);
            }
        }
}

int conv3x3_maxpool_forward_bf16(const uint16_t *x, const uint16_t *w, uint16_t *y, uint8_t *code,
                                 int64_t N, int64_t H, int64_t W, int64_t C, int64_t O, int threads) {
    if (O % 16 || 3 * C > 16) return 2;
    const int64_t OH = (H + 1) / 2, OW = (W + 1) / 2, XB = (W + 7) / 8;
    const int64_t Hp = 2 * OH + 2, Wp = XB * 8 + 2;
    const first_layer s = {H, W, C, O, O / 16, OH, OW, XB, Wp, Hp * Wp * C + 16};
    uint16_t *bw = aligned_alloc(64, (size_t)2 * s.OB * 512 * sizeof(uint16_t));
    if (!bw) return 1;
    pack_weights(w, bw, C, O);
    int failed = 0;
    _Pragma("omp parallel num_threads(threads) reduction(|:failed)")
    {
        uint16_t *pad = aligned_alloc(64, (size_t)((s.pad_elems * 2 + 63) / 64 * 64));
        failed |= pad == NULL;
        configure_tiles();
        _Pragma("omp for schedule(static)")
        for (int64_t n = 0; n < N; n++)
            if (pad) forward_image(s, x, bw, pad, y, code, n);
        _tile_release();
        free(pad);
    }
    free(bw);
    return failed;
}

#else

int amx_request(void) { return 1; }

int conv3x3_maxpool_forward_bf16(const uint16_t *x, const uint16_t *w, uint16_t *y, uint8_t *code,
                                 int64_t N, int64_t H, int64_t W, int64_t C, int64_t O, int threads) {
    (void)x; (void)w; (void)y; (void)code; (void)N; (void)H; (void)W; (void)C; (void)O; (void)threads;
    return -1;
}
#endif /* WGRAD_TILES */

#ifndef WGRAD_VECTOR
int conv3x3_wgrad_bf16(const uint16_t *x, const uint16_t *g, float *dw, int64_t N, int64_t H,
                       int64_t W, int64_t C, int64_t O, int threads, int tiles) {
    (void)x; (void)g; (void)dw; (void)N; (void)H; (void)W; (void)C; (void)O; (void)threads; (void)tiles;
    return -1;
}

int conv3x3_maxpool_wgrad_bf16(const uint16_t *x, const uint16_t *gp, const uint8_t *code, float *dw,
                               int64_t N, int64_t H, int64_t W, int64_t C, int64_t O, int threads, int tiles) {
    (void)x; (void)gp; (void)code; (void)dw; (void)N; (void)H; (void)W; (void)C; (void)O; (void)threads;
    (void)tiles;
    return -1;
}
#endif
