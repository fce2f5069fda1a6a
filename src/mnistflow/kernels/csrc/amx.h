/* AMX helpers shared by the kernels that use the matrix engine (wgrad.c, muon.c): the
 * process's permission and the tile configuration (every tile 16 rows x 64 bytes); the register
 * shuffles that build tiles are vnni.h's. Include only where __AMX_TILE__ and __AMX_BF16__ are
 * defined. */
#ifndef MNISTFLOW_AMX_H
#define MNISTFLOW_AMX_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vnni.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Linux hands a process the AMX register state only on request (once per process). */
static inline int amx_permission(void) {
    return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : 1;
}

static inline void configure_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {  /* every tile 16 rows x 64 bytes */
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

#endif
