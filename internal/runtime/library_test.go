package runtime

import (
	"errors"
	"math"
	"os/exec"
	"path/filepath"
	"testing"
)

// buildFakeBackend compiles testdata/fake_backend.c into dir/libfpk-<name>.so.
func buildFakeBackend(t *testing.T, dir, name string, defines ...string) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build the test backend library")
	}
	out := filepath.Join(dir, "libfpk-"+name+".so")
	args := append([]string{"-shared", "-fPIC", "-O1", "-std=gnu11", "-I.", "-o", out,
		"testdata/fake_backend.c", "-lm"}, defines...)
	if raw, err := exec.CommandContext(t.Context(), cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("build fake backend: %v\n%s", err, raw)
	}
	return out
}

// TestBackendLibrary opens a backend shared library the way the cuda and hip backends will be
// opened: dlopen, entry point, api version, host table; tensors that are not host memory (so
// dtype conversions stage through the host), ops the library has and lacks, and convs served by
// the core's host round trip because the library has no conv tier.
func TestBackendLibrary(t *testing.T) {
	dir := t.TempDir()
	buildFakeBackend(t, dir, "fake")
	rt := newTestRuntime(t, Options{Backend: "fake", BackendDir: dir, Device: 3})
	info := rt.Backend()
	if info.Name != "fake" || info.IsHost || info.Device != 3 || info.DeviceName != "fake device 3" {
		t.Fatalf("backend info %+v", info)
	}
	if len(info.ConvTiers) != 1 || info.ConvTiers[0] != TierCPU {
		t.Fatalf("conv tiers %v, want only cpu", info.ConvTiers)
	}

	// f16 bytes → f32 device tensor (staged conversion) → f32 host
	vals := []float32{1, -2.5, 0.333251953125, 65504, -0, 6.103515625e-05}
	raw := make([]uint16, len(vals))
	for i, v := range vals {
		raw[i] = f32ToF16Test(v)
	}
	x, err := rt.FromBytes(F32, F16, u16bytes(raw), 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	got, err := x.Float32()
	if err != nil {
		t.Fatal(err)
	}
	for i := range vals {
		if got[i] != vals[i] {
			t.Fatalf("element %d: %g, want %g", i, got[i], vals[i])
		}
	}
	y, err := rt.SiLU(x) // the library's op
	if err != nil {
		t.Fatal(err)
	}
	sv, err := y.Float32()
	y.Free()
	if err != nil || math.Abs(float64(sv[0])-1/(1+math.Exp(-1))) > 1e-6 {
		t.Fatalf("silu through the library: %v %v", sv, err)
	}
	if _, err := rt.Add(x, x); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("op the library lacks: got %v, want ErrUnsupported", err)
	}
	x32, err := x.Reshape(3, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer x32.Free()
	if _, err := rt.RoPE(RoPEHalves, x32, x32, x32); !errors.Is(err, ErrUnsupported) { // no rope slot
		t.Fatalf("rope mode the library lacks: got %v, want ErrUnsupported", err)
	}

	// conv: tiers 0–2 unavailable in the library, CPU tier by download, host conv, upload
	f := newConvFixture(t, rt)
	f.run(t, rt)
	s := rt.ConvStats()
	for tier := TierVendorTuned; tier < TierCPU; tier++ {
		if s.Tiers[tier].Unavailable != 1 || s.Tiers[tier].Attempts != 0 {
			t.Fatalf("tier %s: %+v", tier, s.Tiers[tier])
		}
	}
	if s.Tiers[TierCPU].Successes != 1 {
		t.Fatalf("cpu tier: %+v", s.Tiers[TierCPU])
	}

	// the cap holds for library backends too
	if err := rt.SetMemoryCap(int64(rt.Memory().Allocated) + 100); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.NewTensor(F32, 1000); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("over the cap: got %v", err)
	}
}

func TestBackendLibraryBroken(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(Options{Backend: "missing", BackendDir: dir}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("missing library: got %v, want ErrUnavailable", err)
	}
	noEntry := buildFakeBackend(t, dir, "noentry", "-DNO_ENTRY")
	if _, err := New(Options{Backend: "x", LibraryPath: noEntry}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("library without entry point: got %v, want ErrUnsupported", err)
	}
	buildFakeBackend(t, dir, "old", "-DWRONG_VERSION")
	if _, err := New(Options{Backend: "old", BackendDir: dir}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("library of another api version: got %v, want ErrUnsupported", err)
	}
	if _, err := New(Options{Backend: "../evil"}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("backend name with a path: got %v", err)
	}
}

// f32ToF16Test converts exactly representable values (test inputs only).
func f32ToF16Test(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case b&0x7fffffff == 0:
		return sign
	case exp <= 0: // subnormal
		return sign | uint16((mant|0x800000)>>(14-exp))
	}
	return sign | uint16(exp)<<10 | uint16(mant>>13)
}
