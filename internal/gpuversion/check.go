package gpuversion

import "fmt"

// knownBad lists runtime/driver pairs that crash even where the generic rule would let them
// through, with what was seen. (Today the one the issue reports is also caught by the rule.)
var knownBad = []struct {
	backend         string
	runtime, driver Version // releases; a driver at or below driver is bad
	seen            string
}{
	{"hip", Version{6, 4, 0}, Version{6, 1, 0}, "a Stable Diffusion service crashed in cleanup at 1024²"},
}

// Mismatch is a runtime the host driver cannot serve.
type Mismatch struct {
	Versions
	// Why says what is wrong; Fix what the operator does about it.
	Why, Fix string
}

// Error names both versions and the fix.
func (m *Mismatch) Error() string {
	return fmt.Sprintf("%s: %s; fix: %s", m.Versions.Describe(), m.Why, m.Fix)
}

// Describe prints both versions and their sources.
func (v Versions) Describe() string {
	name := map[string]string{"cuda": "CUDA", "hip": "ROCm/HIP"}[v.Backend]
	if name == "" {
		name = v.Backend
	}
	return fmt.Sprintf("%s runtime %s (%s), host driver serves %s (%s)", name, orUnknown(v.Runtime), v.RuntimeSource,
		orUnknown(v.Driver), v.DriverSource)
}

func orUnknown(v Version) string {
	if !v.Known() {
		return "unknown"
	}
	return v.String()
}

// Check returns a *Mismatch when the runtime cannot work with the host driver: a known-bad
// pair, or a runtime release newer than the driver serves. Unknown versions pass (nothing can
// be judged; Describe still shows them).
func Check(v Versions) error {
	if !v.Runtime.Known() || !v.Driver.Known() {
		return nil
	}
	rt, drv := v.Runtime.Release(), v.Driver.Release()
	for _, kb := range knownBad {
		if kb.backend == v.Backend && rt.Compare(kb.runtime) == 0 && drv.Compare(kb.driver) <= 0 {
			return &Mismatch{Versions: v, Why: fmt.Sprintf("known-bad pair (%s)", kb.seen), Fix: fix(v)}
		}
	}
	if rt.Compare(drv) > 0 {
		return &Mismatch{Versions: v, Why: "the runtime is newer than the host driver serves", Fix: fix(v)}
	}
	return nil
}

// fix says how to make the pair work: a newer host driver, or an image built on an older
// runtime (the images' build arguments, deploy/).
func fix(v Versions) string {
	rt, drv := v.Runtime.Release(), v.Driver.Release()
	switch v.Backend {
	case "cuda":
		return fmt.Sprintf("install an NVIDIA driver that supports CUDA %s or later on the host, or use an image built on CUDA %s "+
			"(docker build --build-arg CUDA_VERSION=%s.0 -f deploy/cuda/Dockerfile .)", rt, drv, drv)
	case "hip":
		return fmt.Sprintf("install ROCm %s's amdgpu driver on the host (amdgpu-install --usecase=dkms), or use an image built on ROCm %s "+
			"(docker build --build-arg ROCM_VERSION=%s -f deploy/rocm/Dockerfile .)", rt, drv, drv)
	}
	return "match the runtime to the host driver"
}
