/* The batch norm + ReLU kernels for one element type, included by bnrelu.c once per type with
 *   T, LOAD, STORE  the stored type and its conversions to and from float;
 *   SUFFIX          the names' suffix: NAME(f) is f_SUFFIX.
 * Each inclusion consumes (#undefs) them. */
#define NAME(f) KERNEL_NAME(f, SUFFIX)

static inline void NAME(fwd_sums)(const T *restrict x, double *restrict s, double *restrict q, int64_t n) {
    #pragma omp simd
    for (int64_t k = 0; k < n; k++) {
        double v = LOAD(x[k]);
        s[k] += v;
        q[k] += v * v;
    }
}

static inline void NAME(fwd_apply)(const T *restrict x, T *restrict y, const float *restrict a,
                                  const float *restrict b, int64_t n) {
    #pragma omp simd
    for (int64_t k = 0; k < n; k++) {
        float v = LOAD(x[k]) * a[k] + b[k];
        y[k] = STORE(v > 0.f ? v : 0.f);
    }
}

/* y = relu(x * scale + shift), scale = weight * invstd, shift = bias - mean * scale, with the
   batch's mean and biased variance; the running statistics take the unbiased variance. */
int NAME(bnrelu_forward)(const T *x, T *y, const float *weight, const float *bias,
                        float *running_mean, float *running_var, float *save_mean,
                        float *save_invstd, int64_t M, int64_t C, double momentum, double eps,
                        int threads) {
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    double *acc = calloc((size_t)(2 * threads * C), sizeof(double));
    float *scale = malloc((size_t)(2 * C) * sizeof(float));
    if (!acc || !scale) { free(acc); free(scale); return 1; }
    float *shift = scale + C;
    #pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t r0, r1;
        rows_of(M, t, nt, &r0, &r1);
        double *s = acc + 2 * t * C, *q = s + C;
        for (int64_t r = r0; r < r1; r++) {
            const T *xr = x + r * C;
            int64_t k = 0;
            for (; k + BLOCK <= C; k += BLOCK) NAME(fwd_sums)(xr + k, s + k, q + k, BLOCK);
            NAME(fwd_sums)(xr + k, s + k, q + k, C - k);
        }
        #pragma omp barrier
        #pragma omp single
        for (int64_t c = 0; c < C; c++) {  /* threads' sums in a fixed order */
            double sum = 0, sq = 0;
            for (int u = 0; u < nt; u++) { sum += acc[2 * u * C + c]; sq += acc[2 * u * C + C + c]; }
            double mean = sum / M, var = sq / M - mean * mean;
            if (var < 0) var = 0;
            double invstd = 1.0 / sqrt(var + eps);
            save_mean[c] = (float)mean;
            save_invstd[c] = (float)invstd;
            if (running_mean) {
                running_mean[c] = (float)((1 - momentum) * running_mean[c] + momentum * mean);
                running_var[c] = (float)((1 - momentum) * running_var[c]
                                         + momentum * var * M / (M > 1 ? M - 1 : 1));
            }
            double a = (weight ? weight[c] : 1.0) * invstd;
            scale[c] = (float)a;
            shift[c] = (float)((bias ? bias[c] : 0.0) - mean * a);
        }  /* the implicit barrier of `single`: scale and shift are ready */
        for (int64_t r = r0; r < r1; r++) {
            const T *xr = x + r * C;
            T *yr = y + r * C;
            int64_t k = 0;
            for (; k + BLOCK <= C; k += BLOCK) NAME(fwd_apply)(xr + k, yr + k, scale + k, shift + k, BLOCK);
            NAME(fwd_apply)(xr + k, yr + k, scale + k, shift + k, C - k);
        }
    }
    free(acc);
    free(scale);
    return 0;
}

static inline void NAME(bwd_sums)(const T *restrict g, const T *restrict y, const T *restrict x,
                                 const float *restrict mean, float *restrict s,
                                 float *restrict sx, int64_t n) {
    #pragma omp simd
    for (int64_t k = 0; k < n; k++) {
        float gv = LOAD(g[k]), gz = LOAD(y[k]) > 0.f ? gv : 0.f;  /* loads outside the ?: */
        s[k] += gz;
        sx[k] += gz * (LOAD(x[k]) - mean[k]);
    }
}

static inline void NAME(bwd_apply)(const T *restrict g, const T *restrict y, const T *restrict x,
                                  T *restrict gx, const float *restrict mean,
                                  const float *restrict a, const float *restrict b,
                                  const float *restrict c, int64_t n) {
    #pragma omp simd
    for (int64_t k = 0; k < n; k++) {
        float gv = LOAD(g[k]), gz = LOAD(y[k]) > 0.f ? gv : 0.f;
        gx[k] = STORE(a[k] * gz - b[k] - c[k] * (LOAD(x[k]) - mean[k]));
    }
}

/* gz = g where y > 0 (ReLU's backward), then batch norm's: with xh = (x - mean) * invstd,
   gbias = sum gz, gweight = sum gz * xh, gx = w * invstd * (gz - gbias / M - xh * gweight / M).
   The sums run in float over FOLD rows at a time, folded into doubles. */
int NAME(bnrelu_backward)(const T *g, const T *y, const T *x, const float *weight,
                         const float *save_mean, const float *save_invstd, T *gx, float *gweight,
                         float *gbias, int64_t M, int64_t C, int threads) {
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    double *acc = calloc((size_t)(2 * threads * C), sizeof(double));
    float *part = calloc((size_t)(2 * threads * C), sizeof(float));
    float *coef = malloc((size_t)(3 * C) * sizeof(float));
    if (!acc || !part || !coef) { free(acc); free(part); free(coef); return 1; }
    float *ca = coef, *cb = coef + C, *cc = coef + 2 * C;
    #pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t r0, r1;
        rows_of(M, t, nt, &r0, &r1);
        double *s = acc + 2 * t * C;      /* s[0, C): sum gz; s[C, 2C): sum gz * (x - mean) */
        float *fs = part + 2 * t * C;
        for (int64_t r = r0; r < r1; r++) {
            const T *gr = g + r * C, *yr = y + r * C, *xr = x + r * C;
            int64_t k = 0;
            for (; k + BLOCK <= C; k += BLOCK)
                NAME(bwd_sums)(gr + k, yr + k, xr + k, save_mean + k, fs + k, fs + C + k, BLOCK);
            NAME(bwd_sums)(gr + k, yr + k, xr + k, save_mean + k, fs + k, fs + C + k, C - k);
            if ((r - r0) % FOLD == FOLD - 1 || r == r1 - 1)
                for (int64_t c = 0; c < 2 * C; c++) { s[c] += fs[c]; fs[c] = 0.f; }
        }
        #pragma omp barrier
        #pragma omp single
        for (int64_t c = 0; c < C; c++) {
            double sum = 0, sumx = 0;
            for (int u = 0; u < nt; u++) { sum += acc[2 * u * C + c]; sumx += acc[2 * u * C + C + c]; }
            double invstd = save_invstd[c], w = weight ? weight[c] : 1.0;
            double gw = sumx * invstd;
            if (gweight) gweight[c] = (float)gw;
            if (gbias) gbias[c] = (float)sum;
            ca[c] = (float)(w * invstd);
            cb[c] = (float)(w * invstd * sum / M);
            cc[c] = (float)(w * invstd * invstd * gw / M);
        }
        for (int64_t r = r0; r < r1; r++) {
            const T *gr = g + r * C, *yr = y + r * C, *xr = x + r * C;
            T *o = gx + r * C;
            int64_t k = 0;
            for (; k + BLOCK <= C; k += BLOCK)
                NAME(bwd_apply)(gr + k, yr + k, xr + k, o + k, save_mean + k, ca + k, cb + k, cc + k, BLOCK);
            NAME(bwd_apply)(gr + k, yr + k, xr + k, o + k, save_mean + k, ca + k, cb + k, cc + k, C - k);
        }
    }
    free(acc);
    free(part);
    free(coef);
    return 0;
}

/* Inference: y = relu(x * scale + shift), the caller's per-channel scale and shift (from the
   running statistics): one pass, where PyTorch's batch norm and ReLU take two. */
void NAME(bnrelu_eval)(const T *x, T *y, const float *scale, const float *shift, int64_t M, int64_t C,
                      int threads) {
    #pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static)
    for (int64_t r = 0; r < M; r++) {
        const T *xr = x + r * C;
        T *yr = y + r * C;
        int64_t k = 0;
        for (; k + BLOCK <= C; k += BLOCK) NAME(fwd_apply)(xr + k, yr + k, scale + k, shift + k, BLOCK);
        NAME(fwd_apply)(xr + k, yr + k, scale + k, shift + k, C - k);
    }
}

#undef NAME
#undef T
#undef LOAD
#undef STORE
#undef SUFFIX
