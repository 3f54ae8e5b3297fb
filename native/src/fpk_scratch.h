/*
 * fpk_scratch.h — how much scratch the backends' convs and attention take, in one place: the
 * cpu backend's conv (native/cpu/fpk_cpu_conv.c) and attention, and the gpu backends' vendor
 * conv (native/gpu/fpk_gpu_conv.cu, fpk_gpu_vendor.cu) size their scratch with these functions,
 * and fpk_conv3d_scratch / the shape-only backend (fpk_shape.c) answer from the same ones, so a
 * memory estimate follows the ops. Plain C, static inline: included from C and CUDA/HIP sources.
 */
#ifndef FPK_SCRATCH_H
#define FPK_SCRATCH_H

#include "fpk.h"

#include <stddef.h>
#include <stdint.h>

/* ---- cpu ---------------------------------------------------------------------------------- */

/* Upper bound of the cpu conv's im2col scratch per conv. */
#define FPK_CPU_COL_BUDGET ((size_t)32 << 20)
/* Upper bound of the f32 copy of an f16/bf16 weight per conv: a group's whole weight when it
 * fits (every conv of the HunyuanVideo VAE does), else panels of output channels per band. */
#define FPK_CPU_WEIGHT_BUDGET ((size_t)32 << 20)
/* The cpu attention's chunked tier: floats of scores per chunk of queries. */
#define FPK_CPU_SCORE_BUDGET ((int64_t)4 << 20)

/* Output rows per im2col band of a cpu conv with reduction K and output rows of Wo (of Ho). */
static inline int64_t fpk_cpu_conv_band_rows(int64_t K, int64_t Wo, int64_t Ho) {
    int64_t rows = (int64_t)(FPK_CPU_COL_BUDGET / ((size_t)K * (size_t)Wo * sizeof(float)));
    if (rows < 1) rows = 1;
    if (rows > Ho) rows = Ho;
    return rows;
}

/* ---- gpu ---------------------------------------------------------------------------------- */

/* The gpu backends' conv knobs (fpk_gpu_settings; zero: the default). */
#define FPK_GPU_DEFAULT_WORKSPACE ((int64_t)8192 << 20)
#define FPK_GPU_DEFAULT_NHWC_WORKSPACE ((int64_t)256 << 20)
#define FPK_GPU_DEFAULT_SLAB ((int64_t)1024 << 20)
#define FPK_GPU_DEFAULT_SCORES ((int64_t)1024 << 20)

/* What the vendor search may offer as workspace for a conv whose input and output take io_bytes:
 * NCDHW twice that (room for cuDNN to transform both into the channels-last layout its
 * matrix-unit kernels want), channels-last half of it (no layout transforms: the algorithm's own
 * split-K and the like); at least 16 MiB, at most most_bytes. The search halves it down to what
 * the memory cap leaves. Measured on an H100 (docs/bench/notes/2026-11-25-16bit-activations.md):
 * the full-size VAE decode took 18.7 s with a 1 GiB ceiling and 3.8 s with 8 GiB. */
static inline size_t fpk_gpu_find_workspace_want(size_t io_bytes, int nhwc, int64_t most_bytes) {
    size_t want = nhwc ? io_bytes / 2 : 2 * io_bytes, least = (size_t)16 << 20;
    if (want < least) want = least;
    return want < (size_t)most_bytes ? want : (size_t)most_bytes;
}

/* Output frames per slab of a channels-last conv: the most whose input (N·Cin·HW per frame read,
 * kT + (n−1)·sT frames, at most T) and output (N·K·oHW per frame) fit slab_bytes of es-byte
 * elements and 32-bit counts, at least one, then evened out over the slabs. */
static inline int64_t fpk_gpu_nhwc_slab_frames(int64_t slab_bytes, size_t es, int64_t N, int64_t Cin, int64_t HW,
                                               int64_t T, int64_t kT, int64_t sT, int64_t K, int64_t oHW, int64_t To) {
    int64_t lim = slab_bytes / (int64_t)es, frames;
    for (frames = 1; frames < To; frames++) {
        int64_t n1 = frames + 1, tin = (n1 - 1) * sT + kT;
        if (tin > T) tin = T;
        int64_t xin = N * Cin * HW * tin, yout = N * K * oHW * n1;
        if (xin + yout > lim || xin > INT32_MAX || yout > INT32_MAX) break;
    }
    int64_t slabs = (To + frames - 1) / frames;
    return (To + slabs - 1) / slabs;
}

/* Output frames per slab of the NCDHW vendor path for a tensor beyond 32-bit element counts:
 * within 2 GiB of es-byte elements (and 32 bits) per slab; 0 when not even one fits. */
static inline int64_t fpk_gpu_ncdhw_slab_frames(size_t es, int64_t N, int64_t Cin, int64_t HW, int64_t kT,
                                                int64_t sT, int64_t Cout, int64_t oHW, int64_t To) {
    int64_t lim = INT32_MAX, maxb = ((int64_t)1 << 31) / (int64_t)(es > 2 ? es : 2);
    if (maxb < lim) lim = maxb;
    int64_t per_in = N * Cin * HW * sT, per_out = N * Cout * oHW;
    int64_t frames = (lim - N * Cin * HW * kT) / (per_in > per_out ? per_in : per_out);
    if (frames < 0) frames = 0;
    return frames > To ? To : frames;
}

#endif /* FPK_SCRATCH_H */
