package modelrt

import (
	"fmt"
	"os"
	"strings"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// Estimates (workerkit.Estimator): what a model needs before anything is loaded. A worker
// answers Estimate from the model's config and its checkpoint's headers, in the process the
// supervisor starts for that question alone: no backend is opened, no device touched.

// EstimateDTypes is Activation's rule before any runtime exists: the backend req names stands
// for the runtime ("cuda" and "hip" are devices; "cpu", "auto" and "" count as the host, whose
// f32 activations are the larger estimate when the backend is not known yet). It checks the
// dtype names and applies req.Env first, as Load does, so $FRAMEPACK_ACTIVATION_DTYPE set
// there counts.
func EstimateDTypes(req *workerkit.LoadRequest, gpuDefault runtime.DType) (act, weights runtime.DType, err error) {
	if err := CheckDTypes(req); err != nil {
		return 0, 0, err
	}
	if err := ApplyEnv(req.Env); err != nil {
		return 0, 0, err
	}
	return chooseDTypes(req, os.Getenv(ActivationEnv), !EstimatesDevice(req), gpuDefault)
}

// EstimatesDevice reports whether an estimate for req is for a GPU backend.
func EstimatesDevice(req *workerkit.LoadRequest) bool {
	return req.Backend == "cuda" || req.Backend == "hip"
}

// CheckpointBytes is the size the floating-point tensors of the checkpoint at path (a file or a
// folder holding one, sharded or not) take when loaded in dt (runtime.AsStored: their stored
// dtypes); names under a prefix in skip are left out. It is the estimate of a model whose every
// weight is uploaded in one dtype (SigLIP, CLIP-L).
func CheckpointBytes(path string, dt runtime.DType, skip ...string) (int64, error) {
	ck, err := safetensors.OpenCheckpoint(path)
	if err != nil {
		return 0, fmt.Errorf("estimate %s: %w", path, err)
	}
	defer ck.Close()
	var n int64
	for _, name := range ck.Names() {
		if hasPrefix(name, skip) {
			continue
		}
		info, _ := ck.Info(name)
		stored := runtime.StoredDType(info.DType)
		if !stored.IsFloat() {
			continue
		}
		e := dt
		if e == runtime.AsStored {
			e = stored
		}
		numel := int64(1)
		for _, d := range info.Shape {
			numel *= int64(d)
		}
		n += numel * int64(e.Size())
	}
	return n, nil
}

func hasPrefix(name string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Bytes converts a non-negative estimate to the response's unsigned bytes.
func Bytes(n int64) uint64 { return uint64(max(n, 0)) }
