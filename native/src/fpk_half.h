/* fpk_half.h — exact conversions between float32 and the 16-bit storage types. */
#ifndef FPK_HALF_H
#define FPK_HALF_H

#include <stdint.h>
#include <string.h>

static inline float fpk_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t fpk_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* IEEE half → float, exact: subnormals, infinities and NaNs (payload kept) included. */
static inline float fpk_f16_to_f32(uint16_t h) {
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
static inline uint16_t fpk_f32_to_f16(float f) {
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
static inline float fpk_bf16_to_f32(uint16_t h) { return fpk_bits_f32((uint32_t)h << 16); }

/* float → bfloat16, round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t fpk_f32_to_bf16(float f) {
    uint32_t u = fpk_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif /* FPK_HALF_H */
