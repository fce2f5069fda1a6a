/* Every function the kernel library exports, and nothing else: the library is built with
 * -fvisibility=hidden, so only what is declared here with MNISTFLOW_API is visible to ctypes.
 * Each .c file includes this header, so the compiler rejects a definition that differs from its
 * declaration; tests/unit/test_kernels_abi.py checks the Python bindings (kernels.SIGNATURES)
 * against these declarations. The ABI is in ../README.md.
 *
 * Conventions: tensors are raw pointers to dense memory in the layout each comment names
 * (channels-last, C fastest); bf16 values are their uint16 bit patterns; sizes are int64_t;
 * `threads` (int) is the OpenMP thread count to use (torch's). Kernels that can fail return an
 * int: 0 done, 1 out of memory, 2 a shape the kernel does not take, -1 this build has no AMX.
 */
#ifndef MNISTFLOW_KERNELS_H
#define MNISTFLOW_KERNELS_H
#include <stdint.h>

#define MNISTFLOW_API __attribute__((visibility("default")))

/* maxpool.c: 2x2 stride-2 max-pool (ceil mode). x (N, H, W, C) -> y, code (N, ceil(H/2),
 * ceil(W/2), C); code: which of the 4 inputs won. Backward: gx (N, H, W, C) from g and code,
 * by element size (u16: bf16, u32: fp32). */
MNISTFLOW_API int maxpool2x2_forward_bf16(const uint16_t *x, uint16_t *y, uint8_t *code, int64_t N, int64_t H,
                                          int64_t W, int64_t C, int threads);
MNISTFLOW_API int maxpool2x2_forward_f32(const float *x, float *y, uint8_t *code, int64_t N, int64_t H,
                                         int64_t W, int64_t C, int threads);
MNISTFLOW_API void maxpool2x2_backward_u16(const uint16_t *g, const uint8_t *code, uint16_t *gx, int64_t N,
                                           int64_t H, int64_t W, int64_t C, int threads);
MNISTFLOW_API void maxpool2x2_backward_u32(const uint32_t *g, const uint8_t *code, uint32_t *gx, int64_t N,
                                           int64_t H, int64_t W, int64_t C, int threads);

/* bnrelu.c: batch norm (batch statistics) + ReLU over x (M = N*H*W rows, C channels). weight,
 * bias, running_mean, running_var may be NULL (no affine / no running statistics); in the
 * backward, gweight and gbias may be NULL (not needed). Eval: y = relu(x * scale + shift). */
MNISTFLOW_API int bnrelu_forward_bf16(const uint16_t *x, uint16_t *y, const float *weight, const float *bias,
                                      float *running_mean, float *running_var, float *save_mean,
                                      float *save_invstd, int64_t M, int64_t C, double momentum, double eps,
                                      int threads);
MNISTFLOW_API int bnrelu_forward_f32(const float *x, float *y, const float *weight, const float *bias,
                                     float *running_mean, float *running_var, float *save_mean,
                                     float *save_invstd, int64_t M, int64_t C, double momentum, double eps,
                                     int threads);
MNISTFLOW_API int bnrelu_backward_bf16(const uint16_t *g, const uint16_t *y, const uint16_t *x, const float *weight,
                                       const float *save_mean, const float *save_invstd, uint16_t *gx,
                                       float *gweight, float *gbias, int64_t M, int64_t C, int threads);
MNISTFLOW_API int bnrelu_backward_f32(const float *g, const float *y, const float *x, const float *weight,
                                      const float *save_mean, const float *save_invstd, float *gx,
                                      float *gweight, float *gbias, int64_t M, int64_t C, int threads);
MNISTFLOW_API void bnrelu_eval_bf16(const uint16_t *x, uint16_t *y, const float *scale, const float *shift,
                                    int64_t M, int64_t C, int threads);
MNISTFLOW_API void bnrelu_eval_f32(const float *x, float *y, const float *scale, const float *shift,
                                   int64_t M, int64_t C, int threads);

/* layout.c: src (N, P, C) -> dst (C, P, N), P = H*W, by element size; col2im: gc (N, OH, OW,
 * K, K, C) -> gx (N, H, W, C), the input gradient of a VALID K x K convolution (returns 0, or
 * 1: no memory). */
MNISTFLOW_API void swap_nc_u16(const uint16_t *src, uint16_t *dst, int64_t N, int64_t P, int64_t C, int threads);
MNISTFLOW_API void swap_nc_u32(const uint32_t *src, uint32_t *dst, int64_t N, int64_t P, int64_t C, int threads);
MNISTFLOW_API int col2im_bf16(const uint16_t *gc, uint16_t *gx, int64_t N, int64_t H, int64_t W, int64_t C,
                              int64_t K, int threads);
MNISTFLOW_API int col2im_f32(const float *gc, float *gx, int64_t N, int64_t H, int64_t W, int64_t C, int64_t K,
                             int threads);

/* wgrad.c (AMX, AVX-512-BF16): 0 when this process may use the AMX tiles, else 1 (no AMX in
 * this build, CPU or OS). The weight gradient of a 3x3 padding-1 convolution: x (N, H, W, C),
 * g (N, H, W, O) -> dw (O, 3, 3, C) fp32, on AMX tiles (tiles 1) or AVX-512-BF16 (tiles 0); or
 * from a following 2x2 max-pool's gradient gp and winner codes; and (AMX) that pool of the
 * convolution in one pass (code NULL: inference), w (O, C, 3, 3) bf16. */
MNISTFLOW_API int amx_request(void);
MNISTFLOW_API int conv3x3_wgrad_bf16(const uint16_t *x, const uint16_t *g, float *dw, int64_t N, int64_t H,
                                     int64_t W, int64_t C, int64_t O, int threads, int tiles);
MNISTFLOW_API int conv3x3_maxpool_wgrad_bf16(const uint16_t *x, const uint16_t *gp, const uint8_t *code, float *dw,
                                             int64_t N, int64_t H, int64_t W, int64_t C, int64_t O, int threads,
                                             int tiles);
MNISTFLOW_API int conv3x3_maxpool_forward_bf16(const uint16_t *x, const uint16_t *w, uint16_t *y, uint8_t *code,
                                               int64_t N, int64_t H, int64_t W, int64_t C, int64_t O, int threads);

/* muon.c (AMX, AVX-512-BF16): count fp32 matrices xs[i] (rows[i] x cols[i], rows <= cols,
 * row-major), orthogonalized in place by `steps` Newton-Schulz steps with bf16 products, on AMX
 * tiles (tiles 1) or AVX-512-BF16 (tiles 0). */
MNISTFLOW_API int newton_schulz_bf16(int count, float **xs, const int64_t *rows, const int64_t *cols, int steps,
                                     int threads, int tiles);

#endif
