/* Element access shared by the kernels: bf16 values are stored as uint16 bit patterns (the
 * upper half of a float), converted to float to compute and rounded to nearest even back;
 * fp32 goes through the identity twins, so one kernel body serves both types.
 *
 * That body is a template: <op>_impl.h, which <op>.c includes once per element type with
 * the type's parameters defined (T, LOAD, STORE, SUFFIX, ...: each template's first comment
 * lists its own); the template names what it defines with KERNEL_NAME(f, SUFFIX), f_SUFFIX
 * (maxpool2x2_forward_bf16), and #undefs its parameters at its end. */
#ifndef MNISTFLOW_BF16_H
#define MNISTFLOW_BF16_H
#include <stdint.h>

static inline float bf16_load(uint16_t b) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)b << 16;
    return v.f;
}

static inline uint16_t bf16_store(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    uint32_t rounded = (v.u + 0x7FFF + ((v.u >> 16) & 1)) >> 16;
    uint32_t nan = (v.u >> 16) | 0x40;  /* a quiet NaN; both computed: no branch in the loop */
    return (uint16_t)(f != f ? nan : rounded);
}

static inline float f32_load(float f) { return f; }
static inline float f32_store(float f) { return f; }

#define KERNEL_NAME(f, suffix) KERNEL_NAME_(f, suffix)  /* expands suffix first */
#define KERNEL_NAME_(f, suffix) f##_##suffix

#endif
