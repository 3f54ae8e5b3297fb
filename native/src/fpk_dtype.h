/*
 * fpk_dtype.h — the one dtype table of the native runtime: every fpk_dtype's name, size and kind,
 * and the scalar conversions between float32 and the storage types, written once for the core
 * (upload, download, cast), the cpu backend and the GPU kernels (the functions are host and
 * device functions under nvcc and hipcc).
 *
 * Conversions, all exact where the value is representable:
 *   f16   IEEE half; f32 → f16 rounds to nearest even, overflow gives infinity, NaN stays NaN.
 *   bf16  the top half of an f32; f32 → bf16 rounds to nearest even, NaN stays a quiet NaN.
 *   f8e4m3 (float8_e4m3fn) 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, one NaN
 *         per sign (S.1111.111); largest finite 448, smallest subnormal 2^-9.
 *   f8e5m2 (float8_e5m2) 1 sign, 5 exponent (bias 15), 2 mantissa bits: the top byte of an f16,
 *         with infinities and NaNs; largest finite 57344, smallest subnormal 2^-16.
 * f32 → f8 rounds to nearest even and does NOT saturate, as PyTorch's casts (c10's
 * fp8e4m3fn_from_fp32_value / fp8e5m2_from_fp32_value): an e4m3 value of magnitude 480 or more
 * (rounding up past 448), an infinity or a NaN becomes NaN; e5m2 overflows to infinity and keeps
 * NaN. A caller that wants saturation clamps first (the quantizers do).
 *
 * The host emulators of the GPU kernels (scripts/amdflashemu, scripts/convmmaemu) include this file for the scalar
 * conversions only: they define FPK_DTYPE_SCALARS_ONLY, which leaves out the table (and fpk.h).
 */
#ifndef FPK_DTYPE_H
#define FPK_DTYPE_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define FPK_HD static inline __host__ __device__
#else
#define FPK_HD static inline
#endif

FPK_HD float fpk_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

FPK_HD uint32_t fpk_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- 16-bit types ------------------------------------------------------------------------ */

/* IEEE half → float, exact: subnormals, infinities and NaNs (payload kept) included. */
FPK_HD float fpk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else {
        /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while ((mant & 0x400u) == 0);
        mant &= 0x3ffu;
        u = sign | ((uint32_t)(112 - e) << 23) | (mant << 13);
    }
    return fpk_bits_f32(u);
}

/* float → IEEE half, round to nearest even; overflow gives infinity, NaN stays NaN. */
FPK_HD uint16_t fpk_f32_to_f16(float f) {
    uint32_t u = fpk_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t mant = u & 0x7fffffu;
    if (exp == 0xff) {
        if (mant == 0) return sign | 0x7c00u;
        return sign | 0x7e00u | (uint16_t)(mant >> 13);
    }
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f) return sign | 0x7c00u;
    if (e <= 0) {
        if (e < -10) return sign; /* rounds to zero */
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return sign | (uint16_t)half;
    }
    uint32_t half = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++; /* may carry into inf: fine */
    return sign | (uint16_t)half;
}

/* bfloat16 → float: exact (a shift). */
FPK_HD float fpk_bf16_to_f32(uint16_t h) { return fpk_bits_f32((uint32_t)h << 16); }

/* float → bfloat16, round to nearest even; NaN stays a quiet NaN. */
FPK_HD uint16_t fpk_f32_to_bf16(float f) {
    uint32_t u = fpk_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- 8-bit float types ------------------------------------------------------------------- */

/* float8_e4m3fn → float, exact. */
FPK_HD float fpk_e4m3_to_f32(uint8_t q) {
    uint32_t sign = (uint32_t)(q & 0x80u) << 24;
    uint32_t exp = (q >> 3) & 0xfu, mant = q & 0x7u;
    if (exp == 0xf && mant == 0x7) return fpk_bits_f32(sign | 0x7fc00000u); /* NaN */
    if (exp != 0) return fpk_bits_f32(sign | ((exp + 120u) << 23) | (mant << 20));
    /* zero or subnormal: mant · 2^-9, exact in f32 */
    float v = (float)mant * 0.001953125f;
    return sign ? -v : v;
}

/* float → float8_e4m3fn, round to nearest even; |f| ≥ 480 (what rounds past 448), infinities
 * and NaNs become NaN (no saturation, as PyTorch). */
FPK_HD uint8_t fpk_f32_to_e4m3(float f) {
    uint32_t u = fpk_f32_bits(f);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint8_t r;
    if (u >= 0x43f00000u) { /* 480 and up, inf, NaN */
        r = 0x7f;
    } else if (u < (121u << 23)) { /* below 2^-6, the smallest normal: subnormal or zero */
        /* adding 2^5 puts the bits of mant · 2^-9 in the low bits of the f32 mantissa, rounded
         * to nearest even by the addition itself */
        uint32_t s = fpk_f32_bits(fpk_bits_f32(u) + fpk_bits_f32(141u << 23));
        r = (uint8_t)(s - (141u << 23));
    } else {
        uint32_t odd = (u >> 20) & 1u;
        u += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + odd;
        r = (uint8_t)(u >> 20);
    }
    return (uint8_t)(r | (sign >> 24));
}

/* float8_e5m2 → float, exact (the top byte of an f16). */
FPK_HD float fpk_e5m2_to_f32(uint8_t q) { return fpk_f16_to_f32((uint16_t)((uint16_t)q << 8)); }

/* float → float8_e5m2, round to nearest even; overflow gives infinity, NaN stays NaN. */
FPK_HD uint8_t fpk_f32_to_e5m2(float f) {
    uint32_t u = fpk_f32_bits(f);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint8_t r;
    if (u >= (143u << 23)) { /* 65536 and up, inf, NaN */
        r = u > 0x7f800000u ? 0x7f : 0x7c;
    } else if (u < (113u << 23)) { /* below 2^-14: subnormal or zero */
        uint32_t s = fpk_f32_bits(fpk_bits_f32(u) + fpk_bits_f32(134u << 23));
        r = (uint8_t)(s - (134u << 23));
    } else {
        uint32_t odd = (u >> 21) & 1u;
        u += ((uint32_t)(15 - 127) << 23) + 0xfffffu + odd;
        r = (uint8_t)(u >> 21);
    }
    return (uint8_t)(r | (sign >> 24));
}

#ifndef FPK_DTYPE_SCALARS_ONLY
#include "fpk.h"

/* ---- the table: one function per fact, a switch over every dtype ---------------------------- */

/* Name of dt ("f32", "f8e4m3"; "?" for a value that is no dtype). */
FPK_HD const char *fpk_dtype_name(int dt) {
    switch (dt) {
    case FPK_F32: return "f32";
    case FPK_F16: return "f16";
    case FPK_BF16: return "bf16";
    case FPK_U8: return "u8";
    case FPK_I32: return "i32";
    case FPK_F8E4M3: return "f8e4m3";
    case FPK_F8E5M2: return "f8e5m2";
    }
    return "?";
}

/* Bytes of one element of dt (0 for an unknown dtype). */
FPK_HD size_t fpk_dtype_bytes(int dt) {
    switch (dt) {
    case FPK_F32:
    case FPK_I32: return 4;
    case FPK_F16:
    case FPK_BF16: return 2;
    case FPK_U8:
    case FPK_F8E4M3:
    case FPK_F8E5M2: return 1;
    }
    return 0;
}

/* Whether dt is a floating-point type. */
FPK_HD int fpk_dtype_is_float(int dt) {
    return dt == FPK_F32 || dt == FPK_F16 || dt == FPK_BF16 || dt == FPK_F8E4M3 || dt == FPK_F8E5M2;
}

/* Whether dt is an 8-bit float type. */
FPK_HD int fpk_dtype_is_fp8(int dt) { return dt == FPK_F8E4M3 || dt == FPK_F8E5M2; }

/* The 8-bit float q of dtype dt (FPK_F8E4M3 or FPK_F8E5M2) as a float. */
FPK_HD float fpk_fp8_to_f32(uint8_t q, int dt) { return dt == FPK_F8E5M2 ? fpk_e5m2_to_f32(q) : fpk_e4m3_to_f32(q); }

/* Element i of p (dtype dt) as a float: exact for every float type; integers as their value. */
FPK_HD float fpk_dtype_load(const void *p, int dt, int64_t i) {
    switch (dt) {
    case FPK_F32: return ((const float *)p)[i];
    case FPK_F16: return fpk_f16_to_f32(((const uint16_t *)p)[i]);
    case FPK_BF16: return fpk_bf16_to_f32(((const uint16_t *)p)[i]);
    case FPK_U8: return (float)((const uint8_t *)p)[i];
    case FPK_I32: return (float)((const int32_t *)p)[i];
    case FPK_F8E4M3: return fpk_e4m3_to_f32(((const uint8_t *)p)[i]);
    case FPK_F8E5M2: return fpk_e5m2_to_f32(((const uint8_t *)p)[i]);
    }
    return 0;
}

/* Stores v as element i of p (dtype dt): float types round to nearest even (as above); integer
 * types round toward zero and saturate, NaN becoming 0. */
FPK_HD void fpk_dtype_store(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case FPK_F32: ((float *)p)[i] = v; break;
    case FPK_F16: ((uint16_t *)p)[i] = fpk_f32_to_f16(v); break;
    case FPK_BF16: ((uint16_t *)p)[i] = fpk_f32_to_bf16(v); break;
    case FPK_U8: ((uint8_t *)p)[i] = v != v ? 0 : v <= 0.f ? 0 : v >= 255.f ? 255 : (uint8_t)v; break;
    case FPK_I32:
        ((int32_t *)p)[i] = v != v ? 0 : v <= -2147483648.f ? INT32_MIN : v >= 2147483647.f ? INT32_MAX : (int32_t)v;
        break;
    case FPK_F8E4M3: ((uint8_t *)p)[i] = fpk_f32_to_e4m3(v); break;
    case FPK_F8E5M2: ((uint8_t *)p)[i] = fpk_f32_to_e5m2(v); break;
    }
}
#endif /* FPK_DTYPE_SCALARS_ONLY */

#endif /* FPK_DTYPE_H */
