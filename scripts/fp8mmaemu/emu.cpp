// Host emulation of the CDNA3 fp8 × fp8 MFMA kernel of native/gpu/fpk_gpu_gemm_q_mma.cu
// (fp8mma_wave): the 64 lanes of a wave are threads, the 16x16x32 fp8/bf8 MFMA is emulated from
// its documented layout (operand byte v of lane L: A[L % 16][8 (L / 16) + v],
// B[8 (L / 16) + v][L % 16]; D[4 (L / 16) + v][L % 16]) reading the bytes as the FNUZ types the
// hardware has (e4m3fnuz, e5m2fnuz: exponent bias one more than the OCP types', 0x80 is NaN).
// The kernel is fed OCP bytes (float8_e4m3fn, float8_e5m2) and must give q(a)·q(w)ᵀ exactly as a
// float64 product of the OCP values, for every tile of shapes that are not multiples of 16, with
// negative zeros in both operands and every output written. It checks the kernel's logic against
// those layouts, not the hardware (the on-device self-check does that).
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define FPK_DTYPE_SCALARS_ONLY
#include "fpk_dtype.h"

#define __device__
#define __forceinline__ inline
#define FPK_FP8MMA_EMU 1
typedef float amd_v4f __attribute__((ext_vector_type(4)));

static std::barrier<> *wave_bar;
static uint64_t op_a[64], op_b[64];
thread_local int emu_lane;

// FNUZ decoding: bias 8 (e4m3) or 16 (e5m2), no infinities, 0x80 the only NaN.
static double fnuz(uint8_t q, bool bf8) {
    if (q == 0x80) return NAN;
    int mb = bf8 ? 2 : 3, bias = bf8 ? 16 : 8;
    int exp = (q & 0x7f) >> mb, mant = q & ((1 << mb) - 1);
    double v = exp == 0 ? std::ldexp(mant, 1 - bias - mb) : std::ldexp(1.0 + std::ldexp(mant, -mb), exp - bias);
    return q & 0x80 ? -v : v;
}

static amd_v4f amd_mfma_fp8(uint64_t a, uint64_t b, amd_v4f c, bool bbf8) {
    op_a[emu_lane] = a;
    op_b[emu_lane] = b;
    wave_bar->arrive_and_wait();
    int L = emu_lane;
    amd_v4f d = c;
    for (int v = 0; v < 4; v++) {
        int row = 4 * (L / 16) + v, col = L % 16;
        float acc = c[v];
        for (int k = 0; k < 32; k++) {
            uint8_t ab = (uint8_t)(op_a[row + 16 * (k / 8)] >> (8 * (k % 8)));
            uint8_t bb = (uint8_t)(op_b[col + 16 * (k / 8)] >> (8 * (k % 8)));
            acc += (float)(fnuz(ab, false) * fnuz(bb, bbf8));
        }
        d[v] = acc;
    }
    wave_bar->arrive_and_wait();
    return d;
}

#include "kernel.inc"

static double ocp(uint8_t q, bool e5) { return e5 ? fpk_e5m2_to_f32(q) : fpk_e4m3_to_f32(q); }

static int run_case(int64_t M, int64_t N, int64_t K, bool e5, uint32_t seed) {
    std::vector<uint8_t> aq(M * K), wq(N * K);
    auto next = [&]() { return seed = seed * 1664525u + 1013904223u, (uint8_t)(seed >> 24); };
    for (auto &b : aq) {
        b = next();
        if ((b & 0x7f) == 0x7f) b = 0x80; // no NaN; many negative zeros
    }
    for (auto &b : wq) {
        b = next();
        if (e5 ? (b & 0x7c) == 0x7c : (b & 0x7f) == 0x7f) b = 0x80;
    }
    std::vector<float> d(M * N, NAN);
    std::barrier bar(64);
    wave_bar = &bar;
    for (int64_t m0 = 0; m0 < M; m0 += 16)
        for (int64_t n0 = 0; n0 < N; n0 += 16) {
            std::vector<std::thread> lanes;
            for (int l = 0; l < 64; l++)
                lanes.emplace_back([&, l] {
                    emu_lane = l;
                    fp8mma_wave(l, aq.data(), wq.data(), M, N, K, m0, n0, d.data(), N, e5);
                });
            for (auto &t : lanes) t.join();
        }
    double num = 0, den = 0;
    int64_t unwritten = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double want = 0;
            for (int64_t k = 0; k < K; k++) want += ocp(aq[m * K + k], false) * ocp(wq[n * K + k], e5);
            double got = d[m * N + n];
            if (std::isnan(got)) unwritten++;
            num += (got - want) * (got - want);
            den += want * want;
        }
    double rel = std::sqrt(num / den);
    bool ok = unwritten == 0 && rel < 1e-6;
    printf("fp8mmaemu: M %lld N %lld K %lld weights %s: relative L2 %.3g, %lld outputs not written: %s\n", (long long)M,
           (long long)N, (long long)K, e5 ? "e5m2" : "e4m3", rel, (long long)unwritten, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}

int main() {
    int fails = 0;
    fails += run_case(40, 48, 96, false, 1);
    fails += run_case(37, 29, 64, false, 2);
    fails += run_case(40, 48, 96, true, 3);
    fails += run_case(16, 16, 32, true, 4);
    if (fails) {
        printf("fp8mmaemu: %d cases failed\n", fails);
        return 1;
    }
    printf("fp8mmaemu: every case passed\n");
    return 0;
}
