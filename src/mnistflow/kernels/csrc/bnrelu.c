/* Batch norm (training mode, per-channel batch statistics) followed by ReLU, for
 * channels-last activations viewed as (M rows, C channels), M = N*H*W; forward and backward.
 *
 * PyTorch runs this as four kernels (batch norm forward, ReLU, ReLU backward, batch norm
 * backward) with two passes each over the activation; here the forward is one pass for the
 * statistics and one to normalize, the backward one pass for its two sums and one to write.
 * Rows are split between threads; each thread's sums go to doubles (the backward's via float
 * partial sums over FOLD rows, which GCC vectorizes), combined in thread order, so results do
 * not depend on timing. The kernels are written once, in bnrelu_impl.h, included below once
 * per element type.
 *
 * bf16 values are uint16 bit patterns (bf16.h), rounded to nearest even on the way out.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>

#include "bf16.h"
#include "mnistflow_kernels.h"

#define BLOCK 16  /* channels per inner call: one AVX-512 vector of floats */
#define MAX_THREADS 64
#define FOLD 64   /* rows summed in float before folding into the double sums */

/* Rows [r0, r1) of thread t out of T, contiguous and balanced. */
static inline void rows_of(int64_t M, int t, int T, int64_t *r0, int64_t *r1) {
    *r0 = M * t / T;
    *r1 = M * (t + 1) / T;
}

/* bnrelu_forward_bf16, bnrelu_backward_bf16, bnrelu_eval_bf16 */
#define T uint16_t
#define LOAD bf16_load
#define STORE bf16_store
#define SUFFIX bf16
#include "bnrelu_impl.h"

/* bnrelu_forward_f32, bnrelu_backward_f32, bnrelu_eval_f32 */
#define T float
#define LOAD f32_load
#define STORE f32_store
#define SUFFIX f32
#include "bnrelu_impl.h"
