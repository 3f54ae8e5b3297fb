/* fpk_cpu_vexp.h — eight-lane exp for the cpu backend's hot loops (softmax rows, SiLU, GELU,
 * quick-GELU, sigmoid). Cephes' expf polynomial, about 1 ulp over the clamped range
 * [-87.3, 88.3]; arguments outside it give exp of the bound. GCC vector extensions: SSE pairs
 * on x86-64-v2, one AVX register in the x86-64-v3 clones of the callers. Macros (statement
 * expressions), not functions, so no 32-byte vector crosses a call ABI. */
#ifndef FPK_CPU_VEXP_H
#define FPK_CPU_VEXP_H

#include <stdint.h>

typedef float fpk_v8f __attribute__((vector_size(32)));
typedef int32_t fpk_v8i __attribute__((vector_size(32)));

#define FPK_V8F(c) ((fpk_v8f){c, c, c, c, c, c, c, c})
#define FPK_V8I(c) ((fpk_v8i){c, c, c, c, c, c, c, c})

/* Lane select: m ? a : b (m from a vector comparison: all ones or zero). */
#define FPK_V8_SELECT(m, a, b) ((fpk_v8f)(((m) & (fpk_v8i)(a)) | (~(m) & (fpk_v8i)(b))))

#define FPK_V8_EXP(xin)                                                                          \
    ({                                                                                           \
        fpk_v8f x_ = (xin);                                                                      \
        x_ = FPK_V8_SELECT(x_ < FPK_V8F(-87.3f), FPK_V8F(-87.3f), x_);                           \
        x_ = FPK_V8_SELECT(x_ > FPK_V8F(88.3f), FPK_V8F(88.3f), x_);                             \
        /* k = round(x / ln 2): shifted positive so truncation is floor */                       \
        fpk_v8i k_ = __builtin_convertvector(x_ * FPK_V8F(1.44269504088896341f) + FPK_V8F(128.5f), \
                                             fpk_v8i) - FPK_V8I(128);                            \
        fpk_v8f kf_ = __builtin_convertvector(k_, fpk_v8f);                                      \
        fpk_v8f r_ = x_ - kf_ * FPK_V8F(0.693359375f);                                           \
        r_ = r_ - kf_ * FPK_V8F(-2.12194440e-4f);                                                \
        fpk_v8f p_ = FPK_V8F(1.9875691500e-4f);                                                  \
        p_ = p_ * r_ + FPK_V8F(1.3981999507e-3f);                                                \
        p_ = p_ * r_ + FPK_V8F(8.3334519073e-3f);                                                \
        p_ = p_ * r_ + FPK_V8F(4.1665795894e-2f);                                                \
        p_ = p_ * r_ + FPK_V8F(1.6666665459e-1f);                                                \
        p_ = p_ * r_ + FPK_V8F(5.0000001201e-1f);                                                \
        fpk_v8f e_ = p_ * r_ * r_ + r_ + FPK_V8F(1.0f);                                          \
        /* 2^k: k + 127 in [1, 255) over the clamped range */                                    \
        e_ * (fpk_v8f)((k_ + FPK_V8I(127)) << 23);                                               \
    })

#endif /* FPK_CPU_VEXP_H */
