// emu.cpp — runs the channels-last conv's device code (convmma_body of
// native/gpu/fpk_gpu_conv_mma.cu) on the host for every matrix-instruction policy: NVIDIA
// mma.sync m16n8k16 (with cp.async), AMD MFMA 16x16x16 (wave64) and WMMA 16x16x16 (wave32).
// A block's 256 threads are fibers (ucontext) on one OS thread, switched at __syncthreads and
// at each warp-wide matrix instruction, which is emulated from the fragment layouts the kernel
// assumes (PTX ISA "Matrix Fragments for mma.m16n8k16"; AMD's ISA documents and matrix
// instruction calculator). cp.async copies land at the cp.async.wait_group that covers them,
// not before, so a stage read before its wait shows stale data. Global loads are checked
// against the operands' extents, y has guard elements around it, shared memory starts as NaN.
// Results are compared with a float64 conv of the same 16-bit inputs. It checks the kernel's
// own logic (tiling, the implicit-GEMM indexing, edges, the pipeline, which lane holds what);
// not that the layouts are the hardware's (the launcher's on-device self-check does that), nor
// timing, bank conflicts or register allocation. run.sh extracts the kernel text into
// kernel.inc.
#include <ucontext.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <vector>

#define FPK_DTYPE_SCALARS_ONLY
#include "fpk_dtype.h"

#define __device__
#define __forceinline__ inline
#define __shared__ static

enum { FPK_F32 = 0, FPK_F16 = 1, FPK_BF16 = 2 };

struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};
static uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }

// the library's exact conversions (native/src/fpk_dtype.h), under the names the kernel uses
static float fpk_bf16_f32(uint16_t h) { return fpk_bf16_to_f32(h); }
static uint16_t fpk_f32_bf16(float f) { return fpk_f32_to_bf16(f); }
// f16 → f32 through a table of the library's conversions (the emulator converts per element
// of every fragment: the table keeps the cases fast)
static float f16_table[65536];
static void init_f16_table() {
    for (uint32_t h = 0; h < 65536; h++) f16_table[h] = fpk_f16_to_f32((uint16_t)h);
}
static float fpk_f16_f32(uint16_t h) { return f16_table[h]; }
static uint16_t fpk_f32_f16(float f) { return fpk_f32_to_f16(f); }

static void die(const char *what) {
    fprintf(stderr, "convmmaemu: %s\n", what);
    exit(2);
}

// ---- fibers: one per thread of the block -------------------------------------------------------
struct dim3e {
    unsigned x, y, z;
};
struct copy16 {
    void *dst;
    unsigned char data[16];
};
struct fiber {
    ucontext_t ctx;
    dim3e tid;
    bool done;
    std::vector<char> stack;
    std::deque<std::vector<copy16>> groups; // committed cp.async groups, oldest first
    std::vector<copy16> open;               // copies issued since the last commit
};
static std::vector<fiber> fibers;
static int cur, nfib;
static ucontext_t main_ctx;
static dim3e blockIdx;
static std::function<void()> fiber_entry;
#define threadIdx (fibers[cur].tid)

static void emu_yield() {
    for (int i = 1; i <= nfib; i++) {
        int n = (cur + i) % nfib;
        if (fibers[n].done) continue;
        if (n == cur) return;
        int from = cur;
        cur = n;
        swapcontext(&fibers[from].ctx, &fibers[n].ctx);
        return;
    }
}

// Waits (yielding) until done() holds; a wait that never ends is a deadlock of the kernel.
template <class F> static void emu_wait(F done) {
    for (long spins = 0; !done(); spins++) {
        if (spins > 50000000) die("deadlock: a barrier or a warp-wide instruction some threads never reach");
        emu_yield();
    }
}

static void fiber_main() {
    fiber_entry();
    fibers[cur].done = true; // uc_link goes back to the scheduler
}

// Runs fn as nthreads fibers of one block to completion.
static void run_block(int nthreads, const std::function<void()> &fn) {
    nfib = nthreads;
    if ((int)fibers.size() < nthreads) fibers.resize(nthreads);
    fiber_entry = fn;
    for (int t = 0; t < nthreads; t++) {
        fiber &f = fibers[t];
        if (f.stack.empty()) f.stack.resize(256 * 1024);
        f.done = false;
        f.tid = {(unsigned)t, 0, 0};
        f.groups.clear();
        f.open.clear();
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = &main_ctx;
        makecontext(&f.ctx, fiber_main, 0);
    }
    for (;;) {
        int n = -1;
        for (int t = 0; t < nthreads && n < 0; t++)
            if (!fibers[t].done) n = t;
        if (n < 0) break;
        cur = n;
        swapcontext(&main_ctx, &fibers[n].ctx);
    }
}

static int bar_count, bar_gen;
static void __syncthreads() {
    int g = bar_gen;
    if (++bar_count == nfib) {
        bar_count = 0;
        bar_gen++;
        return;
    }
    emu_wait([&] { return bar_gen != g; });
}

// ---- memory: the operands' extents, checked loads, deferred cp.async --------------------------
struct extent {
    const uint16_t *p;
    size_t n;
};
static extent ext_x, ext_w, ext_sm;
static bool inside(const extent &e, const void *p, size_t bytes) {
    const char *c = (const char *)p, *b = (const char *)e.p;
    return c >= b && c + bytes <= b + e.n * 2;
}
static void check_global(const uint16_t *p) {
    if (((uintptr_t)p & 15) != 0) die("a 16-byte global load is not 16-byte aligned");
    if (!inside(ext_x, p, 16) && !inside(ext_w, p, 16)) die("a global load outside x and w");
}
static uint4 convmma_ld16(const uint16_t *p) {
    check_global(p);
    uint4 v;
    memcpy(&v, p, 16);
    return v;
}
static void cp_async16(void *smem, const void *gmem, bool pred) {
    if (((uintptr_t)smem & 15) != 0 || !inside(ext_sm, smem, 16)) die("cp.async to an unaligned or foreign shared address");
    copy16 c;
    c.dst = smem;
    if (pred) {
        check_global((const uint16_t *)gmem);
        memcpy(c.data, gmem, 16);
    } else {
        memset(c.data, 0, 16);
    }
    fibers[cur].open.push_back(c);
}
static void cp_async16_ca(void *smem, const void *gmem, bool pred) { cp_async16(smem, gmem, pred); }
static void cp_async_commit() {
    fiber &f = fibers[cur];
    f.groups.push_back(std::move(f.open));
    f.open.clear();
}
template <int N> static void cp_async_wait() {
    fiber &f = fibers[cur];
    while ((int)f.groups.size() > N) {
        for (const copy16 &c : f.groups.front()) memcpy(c.dst, c.data, 16);
        f.groups.pop_front();
    }
}

// ---- warp-wide matrix instructions ------------------------------------------------------------
// Each lane deposits its operands; the last to arrive computes every lane's result.
struct warp_state {
    int count = 0, gen = 0;
    int kind[64];
    bool bf[64];
    uint16_t a[64][16], b[64][16];
    float c[64][8], d[64][8];
};
static warp_state warps[8];
static int emu_wave; // lanes a warp of the policy running
static bool bad_layout, seen_bf16, seen_f16;
enum { K_SYNC = 1, K_MFMA = 2, K_WMMA = 3 };

static float dec(uint16_t h, bool bf) { return bf ? fpk_bf16_f32(h) : fpk_f16_f32(h); }

static void compute_warp(warp_state &w, int W) {
    const int kind = w.kind[0];
    const bool bf = w.bf[0];
    for (int L = 1; L < W; L++)
        if (w.kind[L] != kind || w.bf[L] != bf) bad_layout = true;
    (bf ? seen_bf16 : seen_f16) = true;
    float A[16][16], B[16][16], C[16][16];
    int setA[16][16] = {}, setB[16][16] = {}, setC[16][16] = {};
    const int NN = kind == K_SYNC ? 8 : 16;
    auto putA = [&](int i, int k, uint16_t h) {
        float v = dec(h, bf);
        if (setA[i][k] && A[i][k] != v && v == v) bad_layout = true; // WMMA's replicated halves must agree
        A[i][k] = v;
        setA[i][k]++;
    };
    auto putB = [&](int k, int j, uint16_t h) {
        float v = dec(h, bf);
        if (setB[k][j] && B[k][j] != v && v == v) bad_layout = true;
        B[k][j] = v;
        setB[k][j]++;
    };
    // C/D element e of lane L
    auto cpos = [&](int L, int e, int *i, int *j) {
        if (kind == K_SYNC) *i = (L >> 2) + 8 * (e >> 1), *j = 2 * (L & 3) + (e & 1);
        else if (kind == K_MFMA) *i = 4 * (L / 16) + e, *j = L % 16;
        else *i = 2 * e + L / 16, *j = L % 16;
    };
    const int NC = kind == K_SYNC ? 4 : kind == K_MFMA ? 4 : 8;
    for (int L = 0; L < W; L++) {
        if (kind == K_SYNC) {
            // a: 4 registers of 2 halves (lower k in the low half); b: 2 registers
            const int g = L >> 2, t = L & 3;
            const int ar[4] = {g, g + 8, g, g + 8}, ak[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
            for (int r = 0; r < 4; r++) {
                putA(ar[r], ak[r], w.a[L][2 * r]);
                putA(ar[r], ak[r] + 1, w.a[L][2 * r + 1]);
            }
            const int bk[2] = {2 * t, 2 * t + 8};
            for (int r = 0; r < 2; r++) {
                putB(bk[r], g, w.b[L][2 * r]);
                putB(bk[r] + 1, g, w.b[L][2 * r + 1]);
            }
        } else if (kind == K_MFMA) {
            for (int v = 0; v < 4; v++) {
                putA(L % 16, 4 * (L / 16) + v, w.a[L][v]);
                putB(4 * (L / 16) + v, L % 16, w.b[L][v]);
            }
        } else {
            for (int v = 0; v < 16; v++) {
                putA(L % 16, v, w.a[L][v]);
                putB(v, L % 16, w.b[L][v]);
            }
        }
        for (int e = 0; e < NC; e++) {
            int i, j;
            cpos(L, e, &i, &j);
            C[i][j] = w.c[L][e];
            setC[i][j]++;
        }
    }
    const int want = kind == K_WMMA ? 2 : 1; // WMMA: lanes 16..31 repeat A and B
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 16; k++)
            if (setA[i][k] != want) bad_layout = true;
    for (int k = 0; k < 16; k++)
        for (int j = 0; j < NN; j++)
            if (setB[k][j] != want) bad_layout = true;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < NN; j++)
            if (setC[i][j] != 1) bad_layout = true;
    for (int L = 0; L < W; L++)
        for (int e = 0; e < NC; e++) {
            int i, j;
            cpos(L, e, &i, &j);
            float s = C[i][j];
            for (int k = 0; k < 16; k++) s += A[i][k] * B[k][j];
            w.d[L][e] = s;
        }
}

static void warp_op(int kind, bool bf, const uint16_t *a, int na, const uint16_t *b, int nb, const float *c, int nc,
                    float *d) {
    const int W = emu_wave, tid = threadIdx.x, L = tid % W;
    warp_state &w = warps[tid / W];
    w.kind[L] = kind;
    w.bf[L] = bf;
    memcpy(w.a[L], a, na * 2);
    memcpy(w.b[L], b, nb * 2);
    memcpy(w.c[L], c, nc * 4);
    int g = w.gen;
    if (++w.count == W) {
        compute_warp(w, W);
        w.count = 0;
        w.gen++;
    } else {
        emu_wait([&] { return w.gen != g; });
    }
    memcpy(d, w.d[L], nc * 4);
}

static void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, bool bf16) {
    uint16_t ua[8], ub[4];
    for (int r = 0; r < 4; r++) ua[2 * r] = (uint16_t)a[r], ua[2 * r + 1] = (uint16_t)(a[r] >> 16);
    ub[0] = (uint16_t)b0, ub[1] = (uint16_t)(b0 >> 16), ub[2] = (uint16_t)b1, ub[3] = (uint16_t)(b1 >> 16);
    float d[4];
    warp_op(K_SYNC, bf16, ua, 8, ub, 4, c, 4, d);
    memcpy(c, d, 16);
}

template <int KIND, class AB, class ACC> static ACC amd_call(AB a, AB b, ACC c, bool bf16) {
    constexpr int NAB = sizeof(AB) / 2, NC = sizeof(ACC) / 4;
    uint16_t ua[NAB], ub[NAB];
    float fc[NC], fd[NC];
    memcpy(ua, &a, sizeof a);
    memcpy(ub, &b, sizeof b);
    memcpy(fc, &c, sizeof c);
    warp_op(KIND, bf16, ua, NAB, ub, NAB, fc, NC, fd);
    ACC d;
    memcpy(&d, fd, sizeof d);
    return d;
}
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, x, y, z) amd_call<K_MFMA>((a), (b), (c), true)
#define __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, x, y, z) amd_call<K_MFMA>((a), (b), (c), false)
#define __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(a, b, c) amd_call<K_WMMA>((a), (b), (c), true)
#define __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c) amd_call<K_WMMA>((a), (b), (c), false)

#define FPK_AMD_MFMA 1
#define FPK_AMD_WMMA 1
#include "kernel.inc"

// ---- cases ------------------------------------------------------------------------------------
struct conv_case {
    int N, C, T, H, W, K, kT, kH, kW, sT, sH, sW;
};

static const int GUARD = 1024;

// Runs policy MM with ST stages on one case; returns the relative L2 distance to the float64
// conv (and whether every check held).
template <class MM, int ST, bool BF> static double run_case(const conv_case &cc, bool *ok, double *ref_rel) {
    const int To = (cc.T - cc.kT) / cc.sT + 1, Ho = (cc.H - cc.kH) / cc.sH + 1, Wo = (cc.W - cc.kW) / cc.sW + 1;
    const int M = cc.N * To * Ho * Wo, R = cc.kT * cc.kH * cc.kW * cc.C;
    const size_t nx = (size_t)cc.N * cc.T * cc.H * cc.W * cc.C, nw = (size_t)cc.K * R, ny = (size_t)M * cc.K;
    // aligned buffers: x and w exactly their size (loads past them are caught), y with guards
    std::vector<uint4> bx((nx * 2 + 15) / 16 + 1), bw((nw * 2 + 15) / 16 + 1), by((ny * 2 + 4 * GUARD + 15) / 16 + 1);
    uint16_t *x = (uint16_t *)bx.data(), *w = (uint16_t *)bw.data(), *yg = (uint16_t *)by.data();
    uint16_t *y = yg + GUARD;
    uint32_t seed = 777u + cc.C * 131u + cc.K * 7u + cc.W;
    auto rnd = [&] {
        seed = seed * 1664525u + 1013904223u;
        return (float)((int)(seed >> 25) - 64) / 64.f;
    };
    auto enc = [&](float v) { return BF ? fpk_f32_bf16(v) : fpk_f32_f16(v); };
    for (size_t i = 0; i < nx; i++) x[i] = enc(rnd());
    for (size_t i = 0; i < nw; i++) w[i] = enc(rnd());
    for (size_t i = 0; i < ny + 2 * GUARD; i++) yg[i] = 0xffff;
    ext_x = {x, nx};
    ext_w = {w, nw};
    convmma_args a;
    memset(&a, 0, sizeof a);
    a.x = x, a.w = w, a.y = y;
    a.xs_h = (int64_t)cc.W * cc.C;
    a.xs_t = (int64_t)cc.H * a.xs_h;
    a.xs_n = (int64_t)cc.T * a.xs_t;
    a.M = M, a.K = cc.K, a.R = R, a.C = cc.C;
    a.kH = cc.kH, a.kW = cc.kW, a.To = To, a.Ho = Ho, a.Wo = Wo, a.sT = cc.sT, a.sH = cc.sH, a.sW = cc.sW;
    a.tiles_n = (cc.K + MM::BN - 1) / MM::BN;
    const int blocks = (M + CMMA_BM - 1) / CMMA_BM * a.tiles_n;
    std::vector<uint4> smb(ST * CMMA_STAGE(MM::BN) * 2 / 16);
    uint16_t *sm = (uint16_t *)smb.data();
    ext_sm = {sm, smb.size() * 8};
    emu_wave = MM::WAVE;
    bad_layout = seen_bf16 = seen_f16 = false;
    for (auto &ws : warps) ws.count = 0;
    bar_count = 0;
    for (int b = 0; b < blocks; b++) {
        blockIdx = {(unsigned)b, 0, 0};
        for (size_t i = 0; i < smb.size() * 8; i++) sm[i] = 0x7fff; // NaN in f16 and bf16
        run_block(MM::WARPS_M * MM::WARPS_N * MM::WAVE, [&] { convmma_body<MM, ST, BF>(a, sm); });
    }
    // float64 reference, the kernel's reference function, guards
    double num = 0, den = 0, rnum = 0;
    size_t unwritten = 0, guards = 0;
    for (int m = 0; m < M; m++) {
        int wo = m % Wo, q = m / Wo, ho = q % Ho, to = (q / Ho) % To, n = q / (Ho * To);
        for (int k = 0; k < cc.K; k++) {
            double s = 0;
            for (int kt = 0; kt < cc.kT; kt++)
                for (int kh = 0; kh < cc.kH; kh++)
                    for (int kw = 0; kw < cc.kW; kw++)
                        for (int c = 0; c < cc.C; c++) {
                            size_t xi = ((((size_t)n * cc.T + to * cc.sT + kt) * cc.H + ho * cc.sH + kh) * cc.W + wo * cc.sW + kw) *
                                            cc.C + c;
                            size_t wi = (size_t)k * R + ((size_t)(kt * cc.kH + kh) * cc.kW + kw) * cc.C + c;
                            s += (double)dec(x[xi], BF) * dec(w[wi], BF);
                        }
            double got = dec(y[(size_t)m * cc.K + k], BF);
            if (got != got) unwritten++;
            num += (got - s) * (got - s);
            den += s * s;
            double r = convmma_reference<BF>(a, (int64_t)m * cc.K + k);
            rnum += (r - s) * (r - s);
        }
    }
    for (int i = 0; i < GUARD; i++) guards += (yg[i] != 0xffff) + (yg[GUARD + ny + i] != 0xffff);
    double rel = std::sqrt(num / den);
    *ref_rel = std::sqrt(rnum / den);
    bool dt_ok = BF ? seen_bf16 && !seen_f16 : seen_f16 && !seen_bf16;
    *ok = rel <= 1e-2 && *ref_rel <= 1e-5 && !bad_layout && dt_ok && unwritten == 0 && guards == 0;
    if (bad_layout) printf("  fragments: a lane's operand or result position is off the instruction's layout\n");
    if (!dt_ok) printf("  the instructions ran in the wrong dtype\n");
    if (unwritten) printf("  %zu outputs never written\n", unwritten);
    if (guards) printf("  %zu guard elements around y written\n", guards);
    return rel;
}

template <class MM, int ST> static int run_policy(const char *name, const conv_case *cases, int ncases) {
    int fails = 0;
    for (int bf = 0; bf < 2; bf++)
        for (int i = 0; i < ncases; i++) {
            const conv_case &c = cases[i];
            bool ok = false;
            double ref = 0;
            auto t0 = std::chrono::steady_clock::now();
            double rel = bf ? run_case<MM, ST, true>(c, &ok, &ref) : run_case<MM, ST, false>(c, &ok, &ref);
            double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            fails += !ok;
            printf("%-9s ST %d %-4s N %d C %3d %2dx%2dx%2d K %3d k %dx%dx%d s %dx%dx%d: rel L2 %.2e (reference %.1e, %.1f s) "
                   "%s\n",
                   name, ST, bf ? "bf16" : "f16", c.N, c.C, c.T, c.H, c.W, c.K, c.kT, c.kH, c.kW, c.sT, c.sH, c.sW, rel, ref,
                   secs, ok ? "ok" : "FAIL");
        }
    return fails;
}

int main() {
    init_f16_table();
    // N C T H W (padded input) K, kernel, stride
    const conv_case cases[] = {
        {2, 48, 5, 13, 15, 136, 3, 3, 3, 1, 2, 2}, // the self-check's conv: partial tiles, taps across steps
        {1, 16, 3, 6, 7, 24, 3, 3, 3, 1, 1, 1},    // C 16: two taps a step; one small block
        {1, 64, 2, 9, 10, 72, 1, 1, 1, 1, 1, 1},   // 1x1x1, M 180, K 72
        {3, 16, 1, 10, 10, 256, 1, 1, 1, 1, 1, 1}, // one step, 3 row tiles × 2 (4) channel tiles
        {1, 32, 7, 9, 9, 64, 3, 3, 3, 2, 2, 2},    // stride 2 in time too
        {1, 32, 2, 6, 6, 37, 1, 3, 3, 1, 1, 1},    // odd K: single stores
        {1, 128, 3, 5, 11, 130, 3, 3, 3, 1, 1, 1}, // C 128 (a VAE width), K just past a tile
    };
    const int n = sizeof cases / sizeof cases[0];
    int fails = 0;
    fails += run_policy<cmma_sync<8>, 3>("mma.sync8", cases, n);
    fails += run_policy<cmma_sync<8>, 2>("mma.sync8", cases, 2);
    fails += run_policy<cmma_sync<4>, 3>("mma.sync4", cases, n);
    fails += run_policy<cmma_sync<4>, 4>("mma.sync4", cases, 2);
    fails += run_policy<cmma_mfma, 2>("mfma", cases, n);
    fails += run_policy<cmma_wmma, 2>("wmma", cases, n);
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails != 0;
}
