package runtime

/*
#include <stdlib.h>
#include "fpk.h"
*/
import "C"

import (
	"strconv"
	"strings"

	"github.com/framepackd/framepackd/internal/envconfig"
)

// ScratchPolicy names whose conv and attention scratch a shape-only runtime charges, and what
// ConvScratch answers for: "cpu", "cuda" or "hip" (anything else: the cpu's). The gpu knobs
// (conv workspace and slab sizes, layout, attention scores) are the gpu backends' own
// (internal/envconfig's native variables, read as they read them).
type ScratchPolicy string

func (p ScratchPolicy) c() C.fpk_scratch_policy {
	var cp C.fpk_scratch_policy
	name := string(p)
	if len(name) >= len(cp.backend) || strings.ContainsRune(name, 0) {
		name = "cpu"
	}
	for i := range len(name) {
		cp.backend[i] = C.char(name[i])
	}
	cp.conv_workspace_bytes = C.int64_t(envMiB(envconfig.CUDNNWorkspaceMB, 16))
	cp.conv_nhwc_workspace_bytes = C.int64_t(envMiB(envconfig.CUDNNNHWCWorkspaceMB, 16))
	cp.conv_slab_bytes = C.int64_t(envMiB(envconfig.CUDNNSlabMB, 16))
	cp.attention_score_bytes = C.int64_t(envMiB(envconfig.GPUAttentionMiB, 1))
	if envconfig.CUDNNLayout.Get() == "ncdhw" {
		cp.conv_ncdhw = 1
	}
	return cp
}

// envMiB is the size the gpu backend's knob v gives, in bytes, as native/gpu/fpk_gpu_settings.cu
// reads it: 0 (the default) when unset, not a number or under least MiB.
func envMiB(v envconfig.Var, least int64) int64 {
	if mb, err := strconv.ParseInt(v.Get(), 10, 64); err == nil && mb >= least {
		return mb << 20
	}
	return 0
}

// ConvScratch returns the bytes of scratch Conv3d takes beside its operands on the policy's
// backend (its first conv tier) for x, w and out of these shapes and dtypes with params p, and
// whether the backend reads p's input view (upsampling, replicate padding) in place; when it does
// not, the runtime makes that tensor for the call. The backends' convs size their scratch from
// the same policy (native/src/fpk_scratch.h).
func ConvScratch(policy ScratchPolicy, p Conv3dParams, xdt DType, x [5]int, wdt DType, w [5]int, odt DType, out [5]int) (int64, bool, error) {
	cp := policy.c()
	cpar := p.c()
	var xs, ws, os [5]C.int64_t
	for i := range 5 {
		xs[i], ws[i], os[i] = C.int64_t(x[i]), C.int64_t(w[i]), C.int64_t(out[i])
	}
	var n C.uint64_t
	var view C.int
	err := call("conv3d scratch", func() C.fpk_status {
		return C.fpk_conv3d_scratch(&cp, &cpar, C.fpk_dtype(xdt), &xs[0], C.fpk_dtype(wdt), &ws[0], C.fpk_dtype(odt), &os[0], &n, &view)
	})
	return int64(n), view != 0, err
}
