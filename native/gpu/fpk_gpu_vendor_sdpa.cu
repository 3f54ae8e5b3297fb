/*
 * fpk_gpu_vendor_sdpa.cu — the attention chain's vendor tier: cuDNN 9's fused scaled dot-product
 * attention, built through the backend graph API (cudnnBackendCreateDescriptor / SetAttribute /
 * Finalize / GetAttribute / Execute / DestroyDescriptor) from libcudnn.so.9, dlopened with our
 * own prototypes like the rest of fpk_gpu_vendor.cu (no cuDNN header is needed to build; the
 * enum values are cudnn_graph.h's).
 *
 * The graph is the one cuDNN's frontend lowers its SDPA forward node to, and the one its fused
 * flash-attention engine recognises:
 *
 *   S = Q·Kᵀ (matmul, f32) → S·scale (by-value f32) → [padding mask: GEN_INDEX rows/cols,
 *   CMP_LT against the per-batch sequence lengths, AND, BINARY_SELECT −inf] → [causal mask:
 *   GEN_INDEX rows/cols, CMP_GE (row >= col), BINARY_SELECT −inf] → max (reduction)
 *   → sub → exp → sum (reduction) → log + max (the stats, virtual here: inference) → exp/sum
 *   (in the inputs' dtype) → O = P·V (matmul, f32).
 *
 * q, k, v and out are described through their element strides (batch, position, head), so the
 * [B, H, L, D] and [B, L, H, D] layouts need no copies; Kᵀ is K with its last two dims and
 * strides swapped. One execution plan per shape, dtype, layout and mask kind, cached for the
 * backend's life with its workspace size (the workspace itself comes from the scratch pool per
 * call); a graph cuDNN refuses is cached as refused, so the chain falls to flash at once the next
 * time. On ROCm (MIOpen has no fused attention we use) the tier is unavailable.
 */
#include "fpk_gpu_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>

#ifdef FPK_VENDOR_CUDA

/* ---- cudnn_graph.h values ------------------------------------------------------------------- */

enum { /* cudnnBackendDescriptorType_t */
    BK_POINTWISE = 0,
    BK_ENGINECFG = 3,
    BK_ENGINEHEUR = 4,
    BK_EXECUTION_PLAN = 5,
    BK_OP_POINTWISE = 13,
    BK_OPERATIONGRAPH = 15,
    BK_VARIANT_PACK = 16,
    BK_TENSOR = 17,
    BK_MATMUL = 18,
    BK_OP_MATMUL = 19,
    BK_REDUCTION = 21,
    BK_OP_REDUCTION = 22,
};
enum { /* cudnnBackendAttributeType_t */
    TY_HANDLE = 0,
    TY_DATA_TYPE = 1,
    TY_BOOLEAN = 2,
    TY_INT64 = 3,
    TY_FLOAT = 4,
    TY_DOUBLE = 5,
    TY_VOID_PTR = 6,
    TY_HEUR_MODE = 8,
    TY_POINTWISE_MODE = 14,
    TY_BACKEND_DESCRIPTOR = 15,
    TY_REDUCTION_OPERATOR = 18,
};
enum { /* cudnnBackendAttributeName_t */
    A_POINTWISE_MODE = 0,
    A_POINTWISE_MATH_PREC = 1,
    A_POINTWISE_AXIS = 9,
    A_ENGINEHEUR_MODE = 200,
    A_ENGINEHEUR_OPERATION_GRAPH = 201,
    A_ENGINEHEUR_RESULTS = 202,
    A_EXECUTION_PLAN_HANDLE = 400,
    A_EXECUTION_PLAN_ENGINE_CONFIG = 401,
    A_EXECUTION_PLAN_WORKSPACE_SIZE = 402,
    A_OP_POINTWISE_PW_DESCRIPTOR = 750,
    A_OP_POINTWISE_XDESC = 751,
    A_OP_POINTWISE_BDESC = 752,
    A_OP_POINTWISE_YDESC = 753,
    A_OP_POINTWISE_ALPHA1 = 754,
    A_OP_POINTWISE_ALPHA2 = 755,
    A_OP_POINTWISE_TDESC = 758,
    A_OPERATIONGRAPH_HANDLE = 800,
    A_OPERATIONGRAPH_OPS = 801,
    A_TENSOR_BYTE_ALIGNMENT = 900,
    A_TENSOR_DATA_TYPE = 901,
    A_TENSOR_DIMENSIONS = 902,
    A_TENSOR_STRIDES = 903,
    A_TENSOR_UNIQUE_ID = 906,
    A_TENSOR_IS_VIRTUAL = 907,
    A_TENSOR_IS_BY_VALUE = 908,
    A_VARIANT_PACK_UNIQUE_IDS = 1000,
    A_VARIANT_PACK_DATA_POINTERS = 1001,
    A_VARIANT_PACK_WORKSPACE = 1003,
    A_MATMUL_COMP_TYPE = 1500,
    A_MATMUL_PADDING_VALUE = 1503,
    A_OP_MATMUL_ADESC = 1520,
    A_OP_MATMUL_BDESC = 1521,
    A_OP_MATMUL_CDESC = 1522,
    A_OP_MATMUL_DESC = 1523,
    A_OP_MATMUL_M_OVERRIDE = 1525,
    A_OP_MATMUL_N_OVERRIDE = 1526,
    A_OP_MATMUL_K_OVERRIDE = 1527,
    A_REDUCTION_OPERATOR = 1600,
    A_REDUCTION_COMP_TYPE = 1601,
    A_OP_REDUCTION_XDESC = 1610,
    A_OP_REDUCTION_YDESC = 1611,
    A_OP_REDUCTION_DESC = 1612,
};
enum { /* cudnnDataType_t */
    DT_FLOAT = 0,
    DT_HALF = 2,
    DT_INT32 = 4,
    DT_BFLOAT16 = 9,
    DT_BOOLEAN = 11,
};
enum { /* cudnnPointwiseMode_t */
    PW_ADD = 0,
    PW_MUL = 1,
    PW_DIV = 6,
    PW_SUB = 9,
    PW_EXP = 13,
    PW_LOG = 15,
    PW_CMP_GE = 303,
    PW_CMP_LT = 304,
    PW_LOGICAL_AND = 400,
    PW_GEN_INDEX = 501,
    PW_BINARY_SELECT = 601,
};
enum { RED_ADD = 0, RED_MAX = 3 };     /* cudnnReduceTensorOp_t */
enum { HEUR_A = 3, HEUR_FALLBACK = 2 }; /* cudnnBackendHeurMode_t */

/* Built with -DFPK_CUDNN_HEADER_CHECK and cuDNN's headers on the include path (the GPU machine's
 * check script does), every value above is compared with cudnn_graph.h's. */
#ifdef FPK_CUDNN_HEADER_CHECK
#include <cudnn_graph.h>
#define SAME(ours, theirs) static_assert((int)(ours) == (int)(theirs), #theirs)
SAME(BK_POINTWISE, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
SAME(BK_ENGINECFG, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
SAME(BK_ENGINEHEUR, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
SAME(BK_EXECUTION_PLAN, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
SAME(BK_OP_POINTWISE, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
SAME(BK_OPERATIONGRAPH, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
SAME(BK_VARIANT_PACK, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
SAME(BK_TENSOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
SAME(BK_MATMUL, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
SAME(BK_OP_MATMUL, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
SAME(BK_REDUCTION, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
SAME(BK_OP_REDUCTION, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
SAME(TY_HANDLE, CUDNN_TYPE_HANDLE);
SAME(TY_DATA_TYPE, CUDNN_TYPE_DATA_TYPE);
SAME(TY_BOOLEAN, CUDNN_TYPE_BOOLEAN);
SAME(TY_INT64, CUDNN_TYPE_INT64);
SAME(TY_FLOAT, CUDNN_TYPE_FLOAT);
SAME(TY_DOUBLE, CUDNN_TYPE_DOUBLE);
SAME(TY_VOID_PTR, CUDNN_TYPE_VOID_PTR);
SAME(TY_HEUR_MODE, CUDNN_TYPE_HEUR_MODE);
SAME(TY_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE);
SAME(TY_BACKEND_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR);
SAME(TY_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE);
SAME(A_POINTWISE_MODE, CUDNN_ATTR_POINTWISE_MODE);
SAME(A_POINTWISE_MATH_PREC, CUDNN_ATTR_POINTWISE_MATH_PREC);
SAME(A_POINTWISE_AXIS, CUDNN_ATTR_POINTWISE_AXIS);
SAME(A_ENGINEHEUR_MODE, CUDNN_ATTR_ENGINEHEUR_MODE);
SAME(A_ENGINEHEUR_OPERATION_GRAPH, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
SAME(A_ENGINEHEUR_RESULTS, CUDNN_ATTR_ENGINEHEUR_RESULTS);
SAME(A_EXECUTION_PLAN_HANDLE, CUDNN_ATTR_EXECUTION_PLAN_HANDLE);
SAME(A_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
SAME(A_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
SAME(A_OP_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
SAME(A_OP_POINTWISE_XDESC, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
SAME(A_OP_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
SAME(A_OP_POINTWISE_YDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
SAME(A_OP_POINTWISE_ALPHA1, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1);
SAME(A_OP_POINTWISE_ALPHA2, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2);
SAME(A_OP_POINTWISE_TDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
SAME(A_OPERATIONGRAPH_HANDLE, CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
SAME(A_OPERATIONGRAPH_OPS, CUDNN_ATTR_OPERATIONGRAPH_OPS);
SAME(A_TENSOR_BYTE_ALIGNMENT, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
SAME(A_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DATA_TYPE);
SAME(A_TENSOR_DIMENSIONS, CUDNN_ATTR_TENSOR_DIMENSIONS);
SAME(A_TENSOR_STRIDES, CUDNN_ATTR_TENSOR_STRIDES);
SAME(A_TENSOR_UNIQUE_ID, CUDNN_ATTR_TENSOR_UNIQUE_ID);
SAME(A_TENSOR_IS_VIRTUAL, CUDNN_ATTR_TENSOR_IS_VIRTUAL);
SAME(A_TENSOR_IS_BY_VALUE, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
SAME(A_VARIANT_PACK_UNIQUE_IDS, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
SAME(A_VARIANT_PACK_DATA_POINTERS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
SAME(A_VARIANT_PACK_WORKSPACE, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
SAME(A_MATMUL_COMP_TYPE, CUDNN_ATTR_MATMUL_COMP_TYPE);
SAME(A_MATMUL_PADDING_VALUE, CUDNN_ATTR_MATMUL_PADDING_VALUE);
SAME(A_OP_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
SAME(A_OP_MATMUL_BDESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
SAME(A_OP_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
SAME(A_OP_MATMUL_DESC, CUDNN_ATTR_OPERATION_MATMUL_DESC);
SAME(A_OP_MATMUL_M_OVERRIDE, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC);
SAME(A_OP_MATMUL_N_OVERRIDE, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC);
SAME(A_OP_MATMUL_K_OVERRIDE, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC);
SAME(A_REDUCTION_OPERATOR, CUDNN_ATTR_REDUCTION_OPERATOR);
SAME(A_REDUCTION_COMP_TYPE, CUDNN_ATTR_REDUCTION_COMP_TYPE);
SAME(A_OP_REDUCTION_XDESC, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
SAME(A_OP_REDUCTION_YDESC, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
SAME(A_OP_REDUCTION_DESC, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
SAME(DT_FLOAT, CUDNN_DATA_FLOAT);
SAME(DT_HALF, CUDNN_DATA_HALF);
SAME(DT_INT32, CUDNN_DATA_INT32);
SAME(DT_BFLOAT16, CUDNN_DATA_BFLOAT16);
SAME(DT_BOOLEAN, CUDNN_DATA_BOOLEAN);
SAME(PW_ADD, CUDNN_POINTWISE_ADD);
SAME(PW_MUL, CUDNN_POINTWISE_MUL);
SAME(PW_DIV, CUDNN_POINTWISE_DIV);
SAME(PW_SUB, CUDNN_POINTWISE_SUB);
SAME(PW_EXP, CUDNN_POINTWISE_EXP);
SAME(PW_LOG, CUDNN_POINTWISE_LOG);
SAME(PW_CMP_GE, CUDNN_POINTWISE_CMP_GE);
SAME(PW_CMP_LT, CUDNN_POINTWISE_CMP_LT);
SAME(PW_LOGICAL_AND, CUDNN_POINTWISE_LOGICAL_AND);
SAME(PW_GEN_INDEX, CUDNN_POINTWISE_GEN_INDEX);
SAME(PW_BINARY_SELECT, CUDNN_POINTWISE_BINARY_SELECT);
SAME(RED_ADD, CUDNN_REDUCE_TENSOR_ADD);
SAME(RED_MAX, CUDNN_REDUCE_TENSOR_MAX);
SAME(HEUR_A, CUDNN_HEUR_MODE_A);
SAME(HEUR_FALLBACK, CUDNN_HEUR_MODE_FALLBACK);
static_assert(sizeof(cudnnBackendDescriptor_t) == sizeof(void *), "descriptor handle");
#undef SAME
#endif

/* The graph API's entry points, resolved from the library fpk_vendor_open loaded (cuDNN 9). */
enum { G_VERSION, G_CREATE, G_DESTROY, G_SET, G_GET, G_FINALIZE, G_EXECUTE, G_N };
static const char *const graph_syms[] = {"cudnnGetVersion", "cudnnBackendCreateDescriptor",
                                         "cudnnBackendDestroyDescriptor", "cudnnBackendSetAttribute",
                                         "cudnnBackendGetAttribute", "cudnnBackendFinalize",
                                         "cudnnBackendExecute", NULL};
typedef size_t (*g_version_t)(void);
typedef int (*g_create_t)(int, void **);
typedef int (*g_destroy_t)(void *);
typedef int (*g_set_t)(void *, int, int, int64_t, const void *);
typedef int (*g_get_t)(void *, int, int, int64_t, int64_t *, void *);
typedef int (*g_finalize_t)(void *);
typedef int (*g_execute_t)(void *, void *, void *);
typedef const char *(*g_errstr_t)(int);
typedef void (*g_lasterr_t)(char *, size_t);
typedef int (*g_set_stream_t)(void *, cudaStream_t);

#define SDPA_MAX_DESCS 128
#define SDPA_MAX_PLANS 64 /* cached plans and refusals per backend */

/* One cached graph: its key, and either a finalized plan (ok) or the reason cuDNN refused it. */
struct fpk_sdpa_plan {
    int64_t key[24];
    int ok;
    void *plan;
    int64_t workspace;
    void *descs[SDPA_MAX_DESCS]; /* every descriptor the plan was built from, kept alive with it */
    int ndescs;
    char why[384];
    struct fpk_sdpa_plan *next;
};

void fpk_vendor_sdpa_open(fpk_gpu_ctx *c) {
    fpk_vendor_dnn *d = &c->dnn;
    memset(d->gfn, 0, sizeof d->gfn);
    d->graph = 0;
    if (!d->handle || !d->dl) return;
    for (int i = 0; graph_syms[i]; i++) {
        d->gfn[i] = dlsym(d->dl, graph_syms[i]);
        if (!d->gfn[i]) return;
    }
    d->version = ((g_version_t)d->gfn[G_VERSION])();
    /* the SDPA graph with by-value scalars, the padding-mask ops and these enum values: cuDNN 9 */
    d->graph = d->version >= 90000;
}

static void plan_destroy(fpk_vendor_dnn *d, struct fpk_sdpa_plan *p) {
    g_destroy_t destroy = (g_destroy_t)d->gfn[G_DESTROY];
    if (p->plan) destroy(p->plan);
    for (int i = p->ndescs - 1; i >= 0; i--)
        if (p->descs[i]) destroy(p->descs[i]);
    free(p);
}

void fpk_vendor_sdpa_close(fpk_gpu_ctx *c) {
    fpk_vendor_dnn *d = &c->dnn;
    while (d->plans) {
        struct fpk_sdpa_plan *n = d->plans->next;
        plan_destroy(d, d->plans);
        d->plans = n;
    }
}

int fpk_vendor_has_sdpa(fpk_gpu_ctx *c) { return c->dnn.handle != NULL && c->dnn.graph; }

/* ---- graph building --------------------------------------------------------------------------- */

/* Builds descriptors into a plan record; the first failure stops it and says where. */
struct sdpa_builder {
    fpk_vendor_dnn *d;
    struct fpk_sdpa_plan *p;
    int status;     /* first failing cuDNN status, 0 while fine */
    const char *at; /* the step that failed */

    void fail(int s, const char *what) {
        if (status) return;
        status = s;
        at = what;
    }
    void *create(int type, const char *what) {
        if (status) return nullptr;
        if (p->ndescs >= SDPA_MAX_DESCS) {
            fail(-1, "too many descriptors");
            return nullptr;
        }
        void *x = nullptr;
        int s = ((g_create_t)d->gfn[G_CREATE])(type, &x);
        if (s) {
            fail(s, what);
            return nullptr;
        }
        p->descs[p->ndescs++] = x;
        return x;
    }
    void set(void *desc, int attr, int type, int64_t n, const void *val, const char *what) {
        if (status) return;
        int s = ((g_set_t)d->gfn[G_SET])(desc, attr, type, n, val);
        if (s) fail(s, what);
    }
    void finalize(void *desc, const char *what) {
        if (status) return;
        int s = ((g_finalize_t)d->gfn[G_FINALIZE])(desc);
        if (s) fail(s, what);
    }
    void *tensor(int64_t uid, int dt, const int64_t dims[4], const int64_t strides[4], bool virt, bool byval,
                 const char *what) {
        void *t = create(BK_TENSOR, what);
        int64_t align = 16;
        set(t, A_TENSOR_DATA_TYPE, TY_DATA_TYPE, 1, &dt, what);
        set(t, A_TENSOR_DIMENSIONS, TY_INT64, 4, dims, what);
        set(t, A_TENSOR_STRIDES, TY_INT64, 4, strides, what);
        set(t, A_TENSOR_UNIQUE_ID, TY_INT64, 1, &uid, what);
        set(t, A_TENSOR_BYTE_ALIGNMENT, TY_INT64, 1, &align, what);
        if (virt) set(t, A_TENSOR_IS_VIRTUAL, TY_BOOLEAN, 1, &virt, what);
        if (byval) set(t, A_TENSOR_IS_BY_VALUE, TY_BOOLEAN, 1, &byval, what);
        finalize(t, what);
        return t;
    }
    /* y = mode(x[, b][, t]) at math precision prec (axis for GEN_INDEX). */
    void *pointwise(int mode, int prec, void *x, void *b, void *t, void *y, int64_t axis, const char *what) {
        void *pw = create(BK_POINTWISE, what);
        set(pw, A_POINTWISE_MODE, TY_POINTWISE_MODE, 1, &mode, what);
        set(pw, A_POINTWISE_MATH_PREC, TY_DATA_TYPE, 1, &prec, what);
        if (axis >= 0) set(pw, A_POINTWISE_AXIS, TY_INT64, 1, &axis, what);
        finalize(pw, what);
        void *op = create(BK_OP_POINTWISE, what);
        float one = 1.0f;
        set(op, A_OP_POINTWISE_PW_DESCRIPTOR, TY_BACKEND_DESCRIPTOR, 1, &pw, what);
        set(op, A_OP_POINTWISE_XDESC, TY_BACKEND_DESCRIPTOR, 1, &x, what);
        if (b) set(op, A_OP_POINTWISE_BDESC, TY_BACKEND_DESCRIPTOR, 1, &b, what);
        if (t) set(op, A_OP_POINTWISE_TDESC, TY_BACKEND_DESCRIPTOR, 1, &t, what);
        set(op, A_OP_POINTWISE_YDESC, TY_BACKEND_DESCRIPTOR, 1, &y, what);
        set(op, A_OP_POINTWISE_ALPHA1, TY_FLOAT, 1, &one, what);
        set(op, A_OP_POINTWISE_ALPHA2, TY_FLOAT, 1, &one, what);
        finalize(op, what);
        return op;
    }
    /* c = a·b (f32 compute), with optional M/N/K overrides (per-batch sequence lengths). */
    void *matmul(void *a, void *b, void *c, void *m_over, void *n_over, void *k_over, bool pad, const char *what) {
        void *mm = create(BK_MATMUL, what);
        int comp = DT_FLOAT;
        set(mm, A_MATMUL_COMP_TYPE, TY_DATA_TYPE, 1, &comp, what);
        if (pad) {
            double zero = 0.0;
            set(mm, A_MATMUL_PADDING_VALUE, TY_DOUBLE, 1, &zero, what);
        }
        finalize(mm, what);
        void *op = create(BK_OP_MATMUL, what);
        set(op, A_OP_MATMUL_ADESC, TY_BACKEND_DESCRIPTOR, 1, &a, what);
        set(op, A_OP_MATMUL_BDESC, TY_BACKEND_DESCRIPTOR, 1, &b, what);
        set(op, A_OP_MATMUL_CDESC, TY_BACKEND_DESCRIPTOR, 1, &c, what);
        if (m_over) set(op, A_OP_MATMUL_M_OVERRIDE, TY_BACKEND_DESCRIPTOR, 1, &m_over, what);
        if (n_over) set(op, A_OP_MATMUL_N_OVERRIDE, TY_BACKEND_DESCRIPTOR, 1, &n_over, what);
        if (k_over) set(op, A_OP_MATMUL_K_OVERRIDE, TY_BACKEND_DESCRIPTOR, 1, &k_over, what);
        set(op, A_OP_MATMUL_DESC, TY_BACKEND_DESCRIPTOR, 1, &mm, what);
        finalize(op, what);
        return op;
    }
    void *reduction(int red, void *x, void *y, const char *what) {
        void *rd = create(BK_REDUCTION, what);
        int comp = DT_FLOAT;
        set(rd, A_REDUCTION_OPERATOR, TY_REDUCTION_OPERATOR, 1, &red, what);
        set(rd, A_REDUCTION_COMP_TYPE, TY_DATA_TYPE, 1, &comp, what);
        finalize(rd, what);
        void *op = create(BK_OP_REDUCTION, what);
        set(op, A_OP_REDUCTION_XDESC, TY_BACKEND_DESCRIPTOR, 1, &x, what);
        set(op, A_OP_REDUCTION_YDESC, TY_BACKEND_DESCRIPTOR, 1, &y, what);
        set(op, A_OP_REDUCTION_DESC, TY_BACKEND_DESCRIPTOR, 1, &rd, what);
        finalize(op, what);
        return op;
    }
};

/* Tensor ids in the variant pack (virtual tensors count on from V_FIRST). */
enum { U_Q = 1, U_K, U_V, U_O, U_SCALE, U_SEQ_Q, U_SEQ_KV, U_NEG_INF, V_FIRST = 100 };

/* Writes why a graph was refused into p->why: the step, cuDNN's status and its last message. */
static void refuse_reason(fpk_vendor_dnn *d, struct fpk_sdpa_plan *p, int status, const char *at) {
    char last[256] = "";
    g_lasterr_t lasterr = (g_lasterr_t)dlsym(d->dl, "cudnnGetLastErrorString");
    if (lasterr) lasterr(last, sizeof last);
    g_errstr_t errstr = (g_errstr_t)dlsym(d->dl, "cudnnGetErrorString");
    snprintf(p->why, sizeof p->why, "%s: %s (%d)%s%s", at ? at : "?", errstr && status > 0 ? errstr(status) : "?",
             status, last[0] ? ": " : "", last);
}

/* Builds the SDPA graph for sd and finds the first engine config heuristics mode A (then the
 * fallback list) offers that finalizes into a plan. On failure p->ok stays 0 with the reason. */
static void build_plan(fpk_vendor_dnn *d, const fpk_sdpa_desc *sd, struct fpk_sdpa_plan *p) {
    sdpa_builder g = {d, p, 0, nullptr};
    const int64_t B = sd->B, H = sd->H, Hkv = sd->Hkv, Lq = sd->Lq, Lk = sd->Lk, D = sd->D, Dv = sd->Dv;
    const int io = sd->dt == FPK_F16 ? DT_HALF : DT_BFLOAT16;
    const bool masked = sd->seq_kv != nullptr;
    int64_t uid = V_FIRST;
    /* q [b, h, s_q, d]; Kᵀ [b, h_k, d, s_kv]; v [b, h_k, s_kv, d_v]; o [b, h, s_q, d_v] */
    int64_t qd[4] = {B, H, Lq, D}, qs[4] = {sd->qs[0], sd->qs[2], sd->qs[1], 1};
    int64_t kd[4] = {B, Hkv, D, Lk}, ks[4] = {sd->ks[0], sd->ks[2], 1, sd->ks[1]};
    int64_t vd[4] = {B, Hkv, Lk, Dv}, vs[4] = {sd->vs[0], sd->vs[2], sd->vs[1], 1};
    int64_t od[4] = {B, H, Lq, Dv}, os[4] = {sd->os[0], sd->os[2], sd->os[1], 1};
    int64_t sdim[4] = {B, H, Lq, Lk}, sst[4] = {H * Lq * Lk, Lq * Lk, Lk, 1};
    int64_t rdim[4] = {B, H, Lq, 1}, rst[4] = {H * Lq, Lq, 1, 1};
    int64_t one[4] = {1, 1, 1, 1};
    int64_t ldim[4] = {B, 1, 1, 1};
    void *tq = g.tensor(U_Q, io, qd, qs, false, false, "q tensor");
    void *tk = g.tensor(U_K, io, kd, ks, false, false, "k tensor");
    void *tv = g.tensor(U_V, io, vd, vs, false, false, "v tensor");
    void *to = g.tensor(U_O, io, od, os, false, false, "out tensor");
    void *tscale = g.tensor(U_SCALE, DT_FLOAT, one, one, false, true, "scale tensor");
    void *tsq = nullptr, *tskv = nullptr;
    if (masked) {
        tsq = g.tensor(U_SEQ_Q, DT_INT32, ldim, one, false, false, "seq_len_q tensor");
        tskv = g.tensor(U_SEQ_KV, DT_INT32, ldim, one, false, false, "seq_len_kv tensor");
    }
    void *ops[24];
    int nops = 0;
    /* S = Q Kᵀ, scaled */
    void *s0 = g.tensor(uid++, DT_FLOAT, sdim, sst, true, false, "scores");
    ops[nops++] = g.matmul(tq, tk, s0, tsq, tskv, nullptr, masked, "bmm1");
    void *s1 = g.tensor(uid++, DT_FLOAT, sdim, sst, true, false, "scaled scores");
    ops[nops++] = g.pointwise(PW_MUL, DT_FLOAT, s0, tscale, nullptr, s1, -1, "scale");
    void *last = s1;
    void *tneg = nullptr;
    if (masked || sd->causal) tneg = g.tensor(U_NEG_INF, DT_FLOAT, one, one, false, true, "-inf tensor");
    if (masked) {
        /* keys at or past seq_len_kv[b] (and rows past seq_len_q[b]) get −inf */
        void *row = g.tensor(uid++, DT_INT32, sdim, sst, true, false, "row index");
        ops[nops++] = g.pointwise(PW_GEN_INDEX, DT_INT32, last, nullptr, nullptr, row, 2, "gen row index");
        void *col = g.tensor(uid++, DT_INT32, sdim, sst, true, false, "col index");
        ops[nops++] = g.pointwise(PW_GEN_INDEX, DT_INT32, last, nullptr, nullptr, col, 3, "gen col index");
        void *rowok = g.tensor(uid++, DT_BOOLEAN, sdim, sst, true, false, "row mask");
        ops[nops++] = g.pointwise(PW_CMP_LT, DT_BOOLEAN, row, tsq, nullptr, rowok, -1, "row < seq_len_q");
        void *colok = g.tensor(uid++, DT_BOOLEAN, sdim, sst, true, false, "col mask");
        ops[nops++] = g.pointwise(PW_CMP_LT, DT_BOOLEAN, col, tskv, nullptr, colok, -1, "col < seq_len_kv");
        void *keep = g.tensor(uid++, DT_BOOLEAN, sdim, sst, true, false, "padding mask");
        ops[nops++] = g.pointwise(PW_LOGICAL_AND, DT_BOOLEAN, rowok, colok, nullptr, keep, -1, "row and col");
        void *s2 = g.tensor(uid++, DT_FLOAT, sdim, sst, true, false, "masked scores");
        ops[nops++] = g.pointwise(PW_BINARY_SELECT, DT_FLOAT, last, tneg, keep, s2, -1, "select padding");
        last = s2;
    }
    if (sd->causal) {
        /* keys after the query's own position get −inf (top-left: row >= col), as the frontend's
         * causal mask lowers */
        void *row = g.tensor(uid++, DT_INT32, sdim, sst, true, false, "causal row index");
        ops[nops++] = g.pointwise(PW_GEN_INDEX, DT_INT32, last, nullptr, nullptr, row, 2, "gen causal row index");
        void *col = g.tensor(uid++, DT_INT32, sdim, sst, true, false, "causal col index");
        ops[nops++] = g.pointwise(PW_GEN_INDEX, DT_INT32, last, nullptr, nullptr, col, 3, "gen causal col index");
        void *keep = g.tensor(uid++, DT_BOOLEAN, sdim, sst, true, false, "causal mask");
        ops[nops++] = g.pointwise(PW_CMP_GE, DT_BOOLEAN, row, col, nullptr, keep, -1, "row >= col");
        void *s3 = g.tensor(uid++, DT_FLOAT, sdim, sst, true, false, "causal scores");
        ops[nops++] = g.pointwise(PW_BINARY_SELECT, DT_FLOAT, last, tneg, keep, s3, -1, "select causal");
        last = s3;
    }
    /* softmax as the frontend's composite: max, sub, exp, sum, (log + max: stats), div */
    void *mx = g.tensor(uid++, DT_FLOAT, rdim, rst, true, false, "row max");
    ops[nops++] = g.reduction(RED_MAX, last, mx, "max");
    void *sub = g.tensor(uid++, DT_FLOAT, sdim, sst, true, false, "scores - max");
    ops[nops++] = g.pointwise(PW_SUB, DT_FLOAT, last, mx, nullptr, sub, -1, "sub");
    void *ex = g.tensor(uid++, DT_FLOAT, sdim, sst, true, false, "exp");
    ops[nops++] = g.pointwise(PW_EXP, DT_FLOAT, sub, nullptr, nullptr, ex, -1, "exp");
    void *sum = g.tensor(uid++, DT_FLOAT, rdim, rst, true, false, "row sum");
    ops[nops++] = g.reduction(RED_ADD, ex, sum, "sum");
    void *lg = g.tensor(uid++, DT_FLOAT, rdim, rst, true, false, "log sum");
    ops[nops++] = g.pointwise(PW_LOG, DT_FLOAT, sum, nullptr, nullptr, lg, -1, "log");
    void *stats = g.tensor(uid++, DT_FLOAT, rdim, rst, true, false, "stats");
    ops[nops++] = g.pointwise(PW_ADD, DT_FLOAT, mx, lg, nullptr, stats, -1, "stats");
    void *pr = g.tensor(uid++, io, sdim, sst, true, false, "probabilities");
    ops[nops++] = g.pointwise(PW_DIV, DT_FLOAT, ex, sum, nullptr, pr, -1, "div");
    /* O = P V */
    ops[nops++] = g.matmul(pr, tv, to, tsq, nullptr, tskv, false, "bmm2");

    void *graph = g.create(BK_OPERATIONGRAPH, "operation graph");
    g.set(graph, A_OPERATIONGRAPH_HANDLE, TY_HANDLE, 1, &d->handle, "operation graph");
    g.set(graph, A_OPERATIONGRAPH_OPS, TY_BACKEND_DESCRIPTOR, nops, ops, "operation graph");
    g.finalize(graph, "operation graph");
    if (g.status) {
        refuse_reason(d, p, g.status, g.at);
        return;
    }
    /* engine configs: heuristics mode A first, then the fallback list; the first that finalizes */
    const int modes[2] = {HEUR_A, HEUR_FALLBACK};
    int why = 0;
    const char *why_at = "heuristics offer no engine";
    for (int mi = 0; mi < 2 && !p->plan; mi++) {
        sdpa_builder h = {d, p, 0, nullptr};
        void *heur = h.create(BK_ENGINEHEUR, "heuristics");
        h.set(heur, A_ENGINEHEUR_OPERATION_GRAPH, TY_BACKEND_DESCRIPTOR, 1, &graph, "heuristics");
        h.set(heur, A_ENGINEHEUR_MODE, TY_HEUR_MODE, 1, &modes[mi], "heuristics");
        h.finalize(heur, "heuristics");
        int64_t count = 0, got = 0;
        if (!h.status) {
            int s = ((g_get_t)d->gfn[G_GET])(heur, A_ENGINEHEUR_RESULTS, TY_BACKEND_DESCRIPTOR, 0, &count, nullptr);
            if (s) h.fail(s, "heuristics results");
        }
        if (count > 8) count = 8;
        void *cfgs[8] = {nullptr};
        for (int64_t i = 0; i < count; i++) cfgs[i] = h.create(BK_ENGINECFG, "engine config");
        if (!h.status && count > 0) {
            int s = ((g_get_t)d->gfn[G_GET])(heur, A_ENGINEHEUR_RESULTS, TY_BACKEND_DESCRIPTOR, count, &got, cfgs);
            if (s) h.fail(s, "heuristics results");
        }
        if (h.status) {
            why = h.status;
            why_at = h.at;
            continue;
        }
        for (int64_t i = 0; i < got && !p->plan; i++) {
            void *plan = nullptr;
            int s = ((g_create_t)d->gfn[G_CREATE])(BK_EXECUTION_PLAN, &plan);
            if (s) {
                why = s;
                why_at = "execution plan";
                break;
            }
            g_set_t set = (g_set_t)d->gfn[G_SET];
            s = set(plan, A_EXECUTION_PLAN_HANDLE, TY_HANDLE, 1, &d->handle);
            if (!s) s = set(plan, A_EXECUTION_PLAN_ENGINE_CONFIG, TY_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
            if (!s) s = ((g_finalize_t)d->gfn[G_FINALIZE])(plan);
            int64_t ws = 0, n = 0;
            if (!s) s = ((g_get_t)d->gfn[G_GET])(plan, A_EXECUTION_PLAN_WORKSPACE_SIZE, TY_INT64, 1, &n, &ws);
            if (s) {
                ((g_destroy_t)d->gfn[G_DESTROY])(plan);
                why = s;
                why_at = "execution plan";
                continue;
            }
            p->plan = plan;
            p->workspace = ws;
        }
    }
    if (p->plan) {
        p->ok = 1;
        return;
    }
    refuse_reason(d, p, why ? why : 3000, why_at);
}

static void plan_key(const fpk_sdpa_desc *sd, int64_t key[24]) {
    memset(key, 0, 24 * sizeof key[0]);
    int64_t v[] = {sd->B, sd->H, sd->Hkv, sd->Lq, sd->Lk, sd->D, sd->Dv, sd->dt, (sd->seq_kv != nullptr) + 2 * sd->causal,
                   sd->qs[0], sd->qs[1], sd->qs[2], sd->ks[0], sd->ks[1], sd->ks[2], sd->vs[0], sd->vs[1],
                   sd->vs[2], sd->os[0], sd->os[1], sd->os[2]};
    memcpy(key, v, sizeof v);
}

fpk_status fpk_vendor_sdpa(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_sdpa_desc *sd) {
    fpk_vendor_dnn *d = &c->dnn;
    if (!fpk_vendor_has_sdpa(c))
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier needs cuDNN 9's graph API (%s)",
                                 d->handle ? "cuDNN older than 9" : "cuDNN not loaded");
    int64_t key[24];
    plan_key(sd, key);
    struct fpk_sdpa_plan *p = d->plans;
    while (p && memcmp(p->key, key, sizeof key) != 0) p = p->next;
    if (!p) {
        p = (struct fpk_sdpa_plan *)calloc(1, sizeof *p);
        if (!p) return fpk_gpu_set_oom(sizeof *p, 0, "host attention plan record");
        memcpy(p->key, key, sizeof key);
        build_plan(d, sd, p);
        if (!p->ok) { /* keep only the reason: the descriptors are of no further use */
            g_destroy_t destroy = (g_destroy_t)d->gfn[G_DESTROY];
            for (int i = p->ndescs - 1; i >= 0; i--) destroy(p->descs[i]);
            p->ndescs = 0;
        }
        p->next = d->plans;
        d->plans = p;
        /* bounded: past SDPA_MAX_PLANS the oldest record goes, once the device is idle (a
         * plan may own the module of a kernel still queued) */
        int n = 0;
        for (struct fpk_sdpa_plan *q = d->plans; q; q = q->next)
            if (++n == SDPA_MAX_PLANS && q->next) {
                struct fpk_sdpa_plan *old = q->next;
                FPK_CUDA(cudaDeviceSynchronize(), "attention: retire a cuDNN plan");
                q->next = old->next;
                plan_destroy(d, old);
                break;
            }
    }
    if (!p->ok)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE,
                                 "attention: cuDNN declines SDPA B %lld H %lld/%lld Lq %lld Lk %lld D %lld/%lld%s%s: %s",
                                 (long long)sd->B, (long long)sd->H, (long long)sd->Hkv, (long long)sd->Lq,
                                 (long long)sd->Lk, (long long)sd->D, (long long)sd->Dv,
                                 sd->seq_kv ? " (padding mask)" : "", sd->causal ? " (causal)" : "", p->why);
    int s = ((g_set_stream_t)d->fn[2]) /* cudnnSetStream */(d->handle, st);
    if (s) return fpk_gpu_set_error(FPK_ERR_BACKEND, "attention: cudnnSetStream status %d", s);
    fpk_scratch ws(sf);
    if (p->workspace > 0) FPK_TRY(ws.alloc((size_t)p->workspace));
    float scale = sd->scale;
    float neg_inf = d->version < 91000 ? -3.402823466e38f : -INFINITY; /* as cuDNN's frontend picks */
    int64_t uids[8] = {U_Q, U_K, U_V, U_O, U_SCALE, U_SEQ_Q, U_SEQ_KV, U_NEG_INF};
    void *ptrs[8] = {(void *)sd->q, (void *)sd->k, (void *)sd->v, sd->o, &scale,
                     (void *)sd->seq_q, (void *)sd->seq_kv, &neg_inf};
    int n = sd->seq_kv ? 8 : 5;
    if (!sd->seq_kv && sd->causal) { /* no lengths: the −inf scalar goes in their place */
        uids[5] = U_NEG_INF;
        ptrs[5] = &neg_inf;
        n = 6;
    }
    void *vp = nullptr;
    s = ((g_create_t)d->gfn[G_CREATE])(BK_VARIANT_PACK, &vp);
    if (s) return fpk_gpu_set_error(FPK_ERR_BACKEND, "attention: cuDNN variant pack: status %d", s);
    g_set_t set = (g_set_t)d->gfn[G_SET];
    void *wsp = ws.ptr;
    s = set(vp, A_VARIANT_PACK_UNIQUE_IDS, TY_INT64, n, uids);
    if (!s) s = set(vp, A_VARIANT_PACK_DATA_POINTERS, TY_VOID_PTR, n, ptrs);
    if (!s) s = set(vp, A_VARIANT_PACK_WORKSPACE, TY_VOID_PTR, 1, &wsp);
    if (!s) s = ((g_finalize_t)d->gfn[G_FINALIZE])(vp);
    if (!s) s = ((g_execute_t)d->gfn[G_EXECUTE])(d->handle, p->plan, vp);
    ((g_destroy_t)d->gfn[G_DESTROY])(vp);
    if (s) {
        char last[256] = "";
        g_lasterr_t lasterr = (g_lasterr_t)dlsym(d->dl, "cudnnGetLastErrorString");
        if (lasterr) lasterr(last, sizeof last);
        return fpk_gpu_set_error(FPK_ERR_BACKEND, "attention: cuDNN SDPA execute: status %d %s", s, last);
    }
    return fpk_gpu_launched("attention (cuDNN SDPA)");
}

#else /* FPK_VENDOR_ROCM: MIOpen has no fused attention this backend uses */

void fpk_vendor_sdpa_open(fpk_gpu_ctx *c) { (void)c; }
void fpk_vendor_sdpa_close(fpk_gpu_ctx *c) { (void)c; }
int fpk_vendor_has_sdpa(fpk_gpu_ctx *c) {
    (void)c;
    return 0;
}
fpk_status fpk_vendor_sdpa(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_sdpa_desc *sd) {
    (void)c, (void)st, (void)sf, (void)sd;
    return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: no vendor fused attention on ROCm");
}

#endif
