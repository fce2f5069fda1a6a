/* Layout kernels.
 *
 * Swapping the batch and channel axes of a channels-last tensor: (N, H, W, C) memory to
 * (C, H, W, N) memory, i.e. x.transpose(0, 1).contiguous(memory_format=channels_last).
 * The fast net's tiny-map weight gradient needs both its input and its output gradient in
 * that form every step; PyTorch's copy kernel took 0.15-0.25 ms each at 4x4 maps.
 * Elements are moved as 2- or 4-byte words (no arithmetic); blocks of 16 x 16 keep the
 * strided side of the copy within a few cache lines.
 *
 * The input gradient of a VALID K x K convolution from each window's share of it (col2im):
 * one pass writing each element once, sums in fp32 (PyTorch's zero fill plus one strided add
 * per window took 0.5 ms on the fast net's 384 x 4 x 4 x 48 map, longer than the matrix
 * product that made the shares).
 *
 * The kernels are written once, in layout_impl.h, included below once per element size.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "mnistflow_kernels.h"

#define TILE 16

/* swap_nc_u16, col2im_bf16 */
#define T uint16_t
#define LOAD bf16_load
#define STORE bf16_store
#define SUFFIX bf16
#define WORD uint16_t
#define WORD_SUFFIX u16
#include "layout_impl.h"

/* swap_nc_u32, col2im_f32 */
#define T float
#define LOAD f32_load
#define STORE f32_store
#define SUFFIX f32
#define WORD uint32_t
#define WORD_SUFFIX u32
#include "layout_impl.h"
