// emu.cpp — runs the AMD matrix-core flash kernels' device code (flash_amd_body, MFMA and WMMA)
// on the host: one OS thread per lane, barriers for __syncthreads and for each wave-wide
// operation, and the 16x16x16 matrix instructions emulated from the fragment layouts the
// kernels assume (AMD's ISA documents and matrix instruction calculator). It checks the
// kernels' own logic (tiling, masking, online softmax, the transposed products, the lane
// exchange of WMMA's P operand) against a float64 reference; it cannot check that the layouts
// are the hardware's — the on-device self-check does that. The kernel text is extracted from
// native/gpu/fpk_gpu_attention.cu by run.sh into kernel.inc.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define FPK_DTYPE_SCALARS_ONLY
#include "fpk_dtype.h"

#define __device__
#define __forceinline__ inline
#define __shared__ static

struct dim3e {
    int x, y, z;
};
thread_local dim3e threadIdx, blockIdx;
thread_local int emu_lane, emu_wave;

// flash_args as native/gpu/fpk_gpu_attention.cu declares it (run.sh cuts it from there)
#include "flash_args.inc"

enum { FPK_F32 = 0, FPK_F16 = 1, FPK_BF16 = 2 };
#define AMD_NW 4

// the library's exact conversions (native/src/fpk_dtype.h), under the names the kernels use
static float bf16_f32(uint16_t h) { return fpk_bf16_to_f32(h); }
static uint16_t fpk_f32_bf16(float f) { return fpk_f32_to_bf16(f); }
static float f16_f32(uint16_t h) { return fpk_f16_to_f32(h); }
static uint16_t fpk_f32_f16(float f) { return fpk_f32_to_f16(f); }
static void fpk_st(void *p, int dt, int64_t i, float v) {
    if (dt != FPK_F32) abort();
    ((float *)p)[i] = v;
}

// ---- the block and its waves -------------------------------------------------------------------
static std::barrier<> *block_barrier;
static void __syncthreads() { block_barrier->arrive_and_wait(); }

struct wave_state {
    std::unique_ptr<std::barrier<>> bar;
    float f[64];
    uint16_t a[64][16], b[64][16];
    float c[64][8], d[64][8];
    bool bad;
};
static wave_state waves[AMD_NW];
static int emu_wave_size;
static bool emu_bf16_seen, emu_f16_seen;

static float emu_shfl_xor(float v, int mask, int width) {
    if (width != emu_wave_size) abort();
    wave_state &w = waves[emu_wave];
    w.f[emu_lane] = v;
    w.bar->arrive_and_wait();
    float r = w.f[emu_lane ^ mask];
    w.bar->arrive_and_wait();
    return r;
}
#define FPK_SHFL_XOR(v, mask, width) emu_shfl_xor((v), (mask), (width))

// One 16x16x16 product D = A·B + C of the wave. Operand element v of lane L:
//   MFMA (64 lanes): A[L % 16][4 (L / 16) + v], B[4 (L / 16) + v][L % 16], D[4 (L / 16) + v][L % 16]
//   WMMA (32 lanes): A[L % 16][v], B[v][L % 16] (lanes 16..31 must repeat 0..15), D[2v + L / 16][L % 16]
template <int W, int NAB, int NC>
static void emu_mma(const uint16_t *a, const uint16_t *b, const float *c, float *d, bool bf16) {
    wave_state &w = waves[emu_wave];
    memcpy(w.a[emu_lane], a, NAB * 2);
    memcpy(w.b[emu_lane], b, NAB * 2);
    memcpy(w.c[emu_lane], c, NC * 4);
    w.bar->arrive_and_wait();
    if (emu_lane == 0) {
        float A[16][16], B[16][16], C[16][16];
        bool setA[16][16] = {}, setB[16][16] = {};
        auto cv = [&](uint16_t h) { return bf16 ? bf16_f32(h) : f16_f32(h); };
        for (int L = 0; L < W; L++)
            for (int v = 0; v < NAB; v++) {
                int ai = L % 16, ak = W == 64 ? 4 * (L / 16) + v : v;
                int bk = ak, bj = L % 16;
                float av = cv(w.a[L][v]), bv = cv(w.b[L][v]);
                if (setA[ai][ak] && A[ai][ak] != av && !(av != av)) w.bad = true; // WMMA replication
                if (setB[bk][bj] && B[bk][bj] != bv && !(bv != bv)) w.bad = true;
                A[ai][ak] = av, B[bk][bj] = bv;
                setA[ai][ak] = setB[bk][bj] = true;
            }
        for (int L = 0; L < W; L++)
            for (int e = 0; e < NC; e++) {
                int i = W == 64 ? 4 * (L / 16) + e : 2 * e + L / 16, j = L % 16;
                C[i][j] = w.c[L][e];
            }
        for (int L = 0; L < W; L++)
            for (int e = 0; e < NC; e++) {
                int i = W == 64 ? 4 * (L / 16) + e : 2 * e + L / 16, j = L % 16;
                float s = C[i][j];
                for (int k = 0; k < 16; k++) s += A[i][k] * B[k][j];
                w.d[L][e] = s;
            }
    }
    w.bar->arrive_and_wait();
    memcpy(d, w.d[emu_lane], NC * 4);
    w.bar->arrive_and_wait();
}

template <int W, class AB, class ACC> static ACC emu_call(AB a, AB b, ACC c, bool bf16) {
    constexpr int NAB = sizeof(AB) / 2, NC = sizeof(ACC) / 4;
    uint16_t ua[NAB], ub[NAB];
    float fc[NC], fd[NC];
    memcpy(ua, &a, sizeof a);
    memcpy(ub, &b, sizeof b);
    memcpy(fc, &c, sizeof c);
    (bf16 ? emu_bf16_seen : emu_f16_seen) = true;
    emu_mma<W, NAB, NC>(ua, ub, fc, fd, bf16);
    ACC d;
    memcpy(&d, fd, sizeof d);
    return d;
}
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, x, y, z) emu_call<64>((a), (b), (c), true)
#define __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, x, y, z) emu_call<64>((a), (b), (c), false)
#define __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(a, b, c) emu_call<32>((a), (b), (c), true)
#define __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c) emu_call<32>((a), (b), (c), false)

#define FPK_AMD_MFMA 1
#define FPK_AMD_WMMA 1
#include "kernel.inc"

// ---- driver ----------------------------------------------------------------------------------
template <class MM, int HDP> static bool run_kernel(const flash_args &a, int B, int H) {
    const int NT = AMD_NW * MM::WAVE;
    emu_wave_size = MM::WAVE;
    bool ok = true;
    for (int w = 0; w < AMD_NW; w++) {
        waves[w].bar = std::make_unique<std::barrier<>>(MM::WAVE);
        waves[w].bad = false;
    }
    std::barrier<> bb(NT);
    block_barrier = &bb;
    int gx = (a.Lq + 16 * AMD_NW - 1) / (16 * AMD_NW);
    for (int bz = 0; bz < B; bz++)
        for (int by = 0; by < H; by++)
            for (int bx = 0; bx < gx; bx++) {
                std::vector<std::thread> ts;
                for (int t = 0; t < NT; t++)
                    ts.emplace_back([&, t] {
                        threadIdx = {t, 0, 0};
                        blockIdx = {bx, by, bz};
                        emu_lane = t % MM::WAVE;
                        emu_wave = t / MM::WAVE;
                        flash_amd_body<MM, HDP>(a);
                    });
                for (auto &t : ts) t.join();
            }
    for (int w = 0; w < AMD_NW; w++) ok &= !waves[w].bad;
    return ok;
}

template <class MM> static bool run_hdp(const flash_args &a, int B, int H) {
    switch ((a.D + 15) / 16 * 16) {
    case 16: return run_kernel<MM, 16>(a, B, H);
    case 32: return run_kernel<MM, 32>(a, B, H);
    case 48: return run_kernel<MM, 48>(a, B, H);
    case 64: return run_kernel<MM, 64>(a, B, H);
    case 80: return run_kernel<MM, 80>(a, B, H);
    case 96: return run_kernel<MM, 96>(a, B, H);
    case 112: return run_kernel<MM, 112>(a, B, H);
    default: return run_kernel<MM, 128>(a, B, H);
    }
}

// One case: B 2, H heads over Hkv key heads, [B, L, H, D] (blhd) or [B, H, L, D] strides, a
// mask (kind 0 none, 1 key padding with holes + causal band + empty row like the self-check,
// 2 key padding broadcast over queries [B, 1, 1, Lk]). Returns the relative L2 distance to a
// float64 reference computed from the same 16-bit inputs.
static double run_case(bool mfma, bool bf16, int D, int Lq, int Lk, int H, int Hkv, int mask_kind, bool blhd,
                       bool *layout_ok) {
    const int B = 2;
    int dt = bf16 ? FPK_BF16 : FPK_F16;
    std::vector<uint16_t> q((size_t)B * Lq * H * D), k((size_t)B * Lk * Hkv * D), v(k.size());
    uint32_t seed = 12345u + D * 31u + Lq * 7u + Lk;
    auto rnd = [&] {
        seed = seed * 1664525u + 1013904223u;
        return (float)((int)(seed >> 25) - 64) / 64.f;
    };
    auto enc = [&](float x) { return bf16 ? fpk_f32_bf16(x) : fpk_f32_f16(x); };
    auto dec = [&](uint16_t h) { return bf16 ? bf16_f32(h) : f16_f32(h); };
    for (auto &x : q) x = enc(rnd());
    for (auto &x : k) x = enc(rnd());
    for (auto &x : v) x = enc(rnd());
    std::vector<uint8_t> m((size_t)B * Lq * Lk, 1);
    for (int b = 0; b < B; b++)
        for (int qi = 0; qi < Lq; qi++)
            for (int j = 0; j < Lk; j++) {
                bool on = true;
                if (mask_kind == 1) on = b == 0 ? j < Lk - 22 && j % 7 != 3 : j <= qi + 40 && j < Lk - 6 && qi != 5;
                if (mask_kind == 2) on = j < (b == 0 ? Lk - 19 : 1);
                m[((size_t)b * Lq + qi) * Lk + j] = on;
            }
    flash_args a;
    memset(&a, 0, sizeof a);
    a.q = q.data(), a.k = k.data(), a.v = v.data();
    auto strides = [&](int L, int Hh, int64_t s[3]) {
        s[0] = (int64_t)L * Hh * D;
        if (blhd) s[1] = (int64_t)Hh * D, s[2] = D;
        else s[1] = D, s[2] = (int64_t)L * D;
    };
    strides(Lq, H, a.qs);
    strides(Lk, Hkv, a.ks);
    strides(Lk, Hkv, a.vs);
    strides(Lq, H, a.os);
    if (mask_kind) {
        a.m = m.data();
        a.ms[0] = (int64_t)Lq * Lk, a.ms[1] = 0, a.ms[2] = mask_kind == 2 ? 0 : Lk, a.ms[3] = 1;
    }
    a.Lq = Lq, a.Lk = Lk, a.rep = H / Hkv, a.D = D, a.Dv = D;
    a.qdt = a.kdt = a.vdt = dt;
    a.odt = FPK_F32;
    double scale = 2.0 / std::sqrt((double)D);
    a.scale_log2 = (float)(scale * 1.4426950408889634);
    std::vector<float> out((size_t)B * Lq * H * D, NAN);
    a.o = out.data();
    *layout_ok = mfma ? run_hdp<amd_mfma>(a, B, H) : run_hdp<amd_wmma>(a, B, H);
    double num = 0, den = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int qi = 0; qi < Lq; qi++) {
                int hk = h / (H / Hkv);
                std::vector<double> s(Lk);
                double mx = -INFINITY;
                for (int j = 0; j < Lk; j++) {
                    bool on = !mask_kind || m[((size_t)b * Lq + (mask_kind == 2 ? 0 : qi)) * Lk + j];
                    double x = 0;
                    for (int d = 0; d < D; d++)
                        x += (double)dec(q[b * a.qs[0] + qi * a.qs[1] + h * a.qs[2] + d]) *
                             dec(k[b * a.ks[0] + (int64_t)j * a.ks[1] + hk * a.ks[2] + d]);
                    s[j] = on ? x * scale : -INFINITY;
                    mx = std::fmax(mx, s[j]);
                }
                double sum = 0;
                for (int j = 0; j < Lk; j++) sum += s[j] = mx == -INFINITY ? 0 : std::exp(s[j] - mx);
                for (int d = 0; d < D; d++) {
                    double o = 0;
                    for (int j = 0; j < Lk; j++) o += s[j] * dec(v[b * a.vs[0] + (int64_t)j * a.vs[1] + hk * a.vs[2] + d]);
                    o = sum > 0 ? o / sum : 0;
                    double got = out[b * a.os[0] + qi * a.os[1] + h * a.os[2] + d];
                    num += (got - o) * (got - o);
                    den += o * o;
                }
            }
    return std::sqrt(num / den);
}

int main() {
    struct tc {
        int D, Lq, Lk, H, Hkv, mask;
        bool blhd;
    } cases[] = {
        {8, 37, 83, 2, 1, 1, true},    {16, 37, 83, 2, 1, 1, true},  {40, 37, 83, 2, 1, 1, true},
        {64, 37, 83, 2, 1, 1, true},   {72, 70, 100, 2, 2, 2, false}, {128, 37, 83, 2, 1, 1, true},
        {128, 65, 128, 1, 1, 0, true}, {96, 20, 45, 3, 1, 0, false}, {120, 37, 83, 2, 1, 1, true},
    };
    int fails = 0;
    for (int path = 0; path < 2; path++)
        for (int bf = 0; bf < 2; bf++)
            for (const tc &c : cases) {
                emu_bf16_seen = emu_f16_seen = false;
                bool layout_ok = true;
                double rel = run_case(path == 0, bf, c.D, c.Lq, c.Lk, c.H, c.Hkv, c.mask, c.blhd, &layout_ok);
                bool dt_ok = bf ? emu_bf16_seen && !emu_f16_seen : emu_f16_seen && !emu_bf16_seen;
                bool ok = rel <= 1e-2 && layout_ok && dt_ok;
                fails += !ok;
                printf("%-4s %-4s D %3d Lq %3d Lk %3d H %d/%d mask %d %s: rel L2 %.2e%s%s %s\n", path == 0 ? "mfma" : "wmma",
                       bf ? "bf16" : "f16", c.D, c.Lq, c.Lk, c.H, c.Hkv, c.mask, c.blhd ? "blhd" : "bhld", rel,
                       layout_ok ? "" : " (operands not replicated across half-waves)", dt_ok ? "" : " (wrong dtype)",
                       ok ? "ok" : "FAIL");
            }
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails != 0;
}
