package runtime

/*
#include "fpk.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/framepackd/framepackd/internal/envconfig"
)

// AttentionLayout is how Attention's operands lay out their heads and positions.
type AttentionLayout int

// Attention layouts.
const (
	// AttentionBHLD: q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] → [B, H, Lq, Dv].
	AttentionBHLD AttentionLayout = C.FPK_ATTN_BHLD
	// AttentionBLHD: q [B, Lq, H, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv] → [B, Lq, H, Dv],
	// the layout of a projection reshaped to heads: read through strides, no permute copies.
	AttentionBLHD AttentionLayout = C.FPK_ATTN_BLHD
)

// AttentionTier is one implementation in the attention chain, tried in this order.
type AttentionTier int

// Attention tiers.
const (
	// AttentionAuto runs the chain (or the tier Options.AttentionTier forces).
	AttentionAuto AttentionTier = C.FPK_ATTN_TIER_AUTO
	// AttentionVendor is the vendor library's fused attention: cuDNN 9's SDPA graph on the cuda
	// backend (bf16/f16 q, k, v — the 16-bit activations GPU models load with; f32 is declined —
	// head dims cuDNN takes, no mask or a key-padding mask); unavailable where cuDNN 9 is
	// missing, for what it declines, on the hip backend (MIOpen has none) and on the cpu backend.
	AttentionVendor AttentionTier = C.FPK_ATTN_TIER_VENDOR
	// AttentionFlash is our fused kernel: tiles of queries against streamed keys and values,
	// online softmax, f32 accumulation, no score matrix.
	AttentionFlash AttentionTier = C.FPK_ATTN_TIER_FLASH
	// AttentionChunked is GEMM, masked softmax, GEMM per chunk of queries.
	AttentionChunked AttentionTier = C.FPK_ATTN_TIER_CHUNKED
	// AttentionCPU is the cpu backend's flash attention (a host round trip on GPU backends).
	AttentionCPU AttentionTier = C.FPK_ATTN_TIER_CPU
	// NumAttentionTiers counts the tiers, AttentionAuto included.
	NumAttentionTiers = int(C.FPK_ATTN_TIER_COUNT)
)

var attentionTierNames = [...]string{"auto", "vendor", "flash", "chunked", "cpu"}

// String is the tier's name as ParseAttentionTier reads it.
func (t AttentionTier) String() string {
	if t >= 0 && int(t) < len(attentionTierNames) {
		return attentionTierNames[t]
	}
	return fmt.Sprintf("attention tier %d", int(t))
}

// ParseAttentionTier reads a tier name: auto, vendor, flash, chunked or cpu.
func ParseAttentionTier(s string) (AttentionTier, error) {
	for i, n := range attentionTierNames {
		if strings.EqualFold(s, n) {
			return AttentionTier(i), nil
		}
	}
	return 0, fmt.Errorf("unknown attention tier %q (want one of %s)", s, strings.Join(attentionTierNames[:], ", "))
}

// EnvAttentionTier forces one attention tier ("vendor", "flash", "chunked", "cpu") when
// Options.AttentionTier is AttentionAuto: only that tier is tried (tests of each tier).
var EnvAttentionTier = envconfig.AttentionTier.Name

// AttentionStats counts the attentions each tier served and the tiers that answered
// unavailable (indexed by AttentionTier; AttentionAuto unused).
type AttentionStats struct {
	Served      [NumAttentionTiers]uint64
	Unavailable [NumAttentionTiers]uint64
}

type attentionCounters struct {
	served, unavailable [NumAttentionTiers]atomic.Uint64
}

// AttentionStats returns the attention chain's counters so far.
func (rt *Runtime) AttentionStats() AttentionStats {
	var s AttentionStats
	for i := range s.Served {
		s.Served[i] = rt.attn.served[i].Load()
		s.Unavailable[i] = rt.attn.unavailable[i].Load()
	}
	return s
}

// AttentionParams are the options of Attention.
type AttentionParams struct {
	Scale      float32         // 0 means 1/sqrt(D)
	QueryChunk int             // chunked tier: queries per chunk; 0 = the backend's default (bounded scratch)
	Layout     AttentionLayout // AttentionBHLD (the zero value) or AttentionBLHD
	// Tier forces one tier for this call; AttentionAuto runs the chain (vendor, flash,
	// chunked, cpu: the first that is available serves) or Options.AttentionTier alone.
	Tier AttentionTier
	// Causal says the mask is causal (query i attends to keys j ≤ i) and a key-padding mask
	// (each batch entry's first n ≥ 1 keys): Llama's and CLIP's. The vendor tier checks that on
	// the device and serves it with cuDNN's causal mask; the other tiers read the mask as always.
	Causal bool
}

// Attention is scaled dot-product attention. Layout AttentionBHLD: q [B, H, Lq, D];
// k [B, Hkv, Lk, D]; v [B, Hkv, Lk, Dv] → [B, H, Lq, Dv]; AttentionBLHD: q [B, Lq, H, D],
// k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv] → [B, Lq, H, Dv]. H is a multiple of Hkv
// (grouped-query); mask nil or U8 broadcastable to [B, H, Lq, Lk] in either layout (nonzero =
// attend; a fully masked query row gives zeros).
//
// The tiers are tried in order — vendor fused attention, our flash kernel, the chunked
// GEMM + softmax path, the cpu backend's flash attention — and the first that is available for
// these operands serves; a tier's real failure (out of memory, a kernel error) is returned,
// not hidden by the next tier. A forced tier (AttentionParams.Tier, Options.AttentionTier,
// EnvAttentionTier) is tried alone: unavailable is then an error.
func (rt *Runtime) Attention(q, k, v, mask *Tensor, p AttentionParams) (*Tensor, error) {
	const op = "attention"
	if err := required(op, q, k, v); err != nil {
		return nil, err
	}
	if q.Rank() != 4 || v.Rank() != 4 {
		return nil, argError(op, "q %s and v %s must have 4 dims", q, v)
	}
	if p.Layout != AttentionBHLD && p.Layout != AttentionBLHD {
		return nil, argError(op, "unknown layout %d", int(p.Layout))
	}
	if p.Tier < 0 || int(p.Tier) >= NumAttentionTiers {
		return nil, argError(op, "unknown tier %d", int(p.Tier))
	}
	tiers := []AttentionTier{AttentionVendor, AttentionFlash, AttentionChunked, AttentionCPU}
	switch {
	case p.Tier != AttentionAuto:
		tiers = []AttentionTier{p.Tier}
	case rt.opts.AttentionTier != AttentionAuto:
		tiers = []AttentionTier{rt.opts.AttentionTier}
	}
	shape := []int{q.Dim(0), q.Dim(1), q.Dim(2), v.Dim(3)} // [B, H, Lq, Dv] or [B, Lq, H, Dv]
	return rt.op(op, q.dtype, shape, []*Tensor{q, k, v, mask}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		var st C.fpk_status
		for i, t := range tiers {
			cp := C.fpk_attention_params{scale: C.float(p.Scale), query_chunk: C.int64_t(p.QueryChunk),
				layout: C.int32_t(p.Layout), tier: C.int32_t(t)}
			if p.Causal {
				cp.causal = 1
			}
			st = C.fpk_op_attention(rt.stream, &cp, in[0], in[1], in[2], in[3], out)
			if st == C.FPK_OK {
				rt.attn.served[t].Add(1)
				return st
			}
			if st != C.FPK_ERR_UNAVAILABLE || i == len(tiers)-1 {
				return st
			}
			rt.attn.unavailable[t].Add(1)
		}
		return st
	})
}
