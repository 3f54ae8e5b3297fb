package runtime

import (
	"errors"
	"strings"
	"testing"
)

// TestBackendFromEnv: FRAMEPACK_BACKEND and FRAMEPACK_NATIVE_DIR choose the backend of the
// default Options (how the same test binaries run on a GPU machine).
func TestBackendFromEnv(t *testing.T) {
	dir := t.TempDir()
	buildFakeBackend(t, dir, "fake")
	t.Setenv(EnvBackend, "fake")
	t.Setenv(EnvNativeDir, dir)
	rt := newTestRuntime(t, Options{})
	if got := rt.Backend().Name; got != "fake" {
		t.Fatalf("backend %q, want fake from %s", got, EnvBackend)
	}
	// an explicit backend wins over the environment
	cpu := newTestRuntime(t, Options{Backend: "cpu"})
	if got := cpu.Backend().Name; got != "cpu" {
		t.Fatalf("backend %q, want cpu", got)
	}
}

// TestBackendAuto: "auto" takes the first backend of AutoBackends that opens, passing over
// missing libraries, and reports every failure when none opens.
func TestBackendAuto(t *testing.T) {
	dir := t.TempDir()
	buildFakeBackend(t, dir, "fake")
	saved := AutoBackends
	t.Cleanup(func() { AutoBackends = saved })
	t.Setenv(EnvBackend, "")

	tests := []struct {
		name  string
		order []string
		want  string
		fails bool
	}{
		{name: "first missing", order: []string{"missing", "fake", "cpu"}, want: "fake"},
		{name: "falls to cpu", order: []string{"missing", "cpu"}, want: "cpu"},
		{name: "none opens", order: []string{"missing", "gone"}, fails: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			AutoBackends = tc.order
			if tc.fails {
				if _, err := New(Options{Backend: "auto", BackendDir: dir}); !errors.Is(err, ErrUnavailable) {
					t.Fatalf("got %v, want ErrUnavailable", err)
				}
				return
			}
			rt := newTestRuntime(t, Options{Backend: "auto", BackendDir: dir})
			if got := rt.Backend().Name; got != tc.want {
				t.Fatalf("auto chose %q, want %q", got, tc.want)
			}
		})
	}
}

// TestConvTierFromEnv: FRAMEPACK_CONV_TIER forces one tier: convs that tier serves pass, and
// a tier the backend lacks fails instead of falling through.
func TestConvTierFromEnv(t *testing.T) {
	t.Setenv(EnvBackend, "cpu")
	t.Setenv(EnvConvTier, "cpu")
	rt := newTestRuntime(t, Options{})
	f := newConvFixture(t, rt)
	f.run(t, rt)
	s := rt.ConvStats()
	if s.Tiers[TierCPU].Successes != 1 || s.Tiers[TierVendorTuned].SkippedPolicy != 1 {
		t.Fatalf("forced cpu tier: %+v", s.Tiers)
	}

	t.Setenv(EnvConvTier, "own_kernel")
	rt2 := newTestRuntime(t, Options{})
	x, err := rt2.Zeros(F32, 1, 2, 3, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	w, err := rt2.Zeros(F32, 2, 2, 1, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Free()
	if y, err := rt2.Conv3d(x, w, nil, Conv3dParams{}); !errors.Is(err, ErrNoConvTier) {
		y.Free()
		t.Fatalf("forced tier the cpu backend lacks: got %v, want ErrNoConvTier", err)
	}
	if s := rt2.ConvStats(); s.Tiers[TierCPU].SkippedPolicy != 1 || s.Tiers[TierCPU].Attempts != 0 {
		t.Fatalf("cpu tier ran though own_kernel was forced: %+v", s.Tiers[TierCPU])
	}

	t.Setenv(EnvConvTier, "fastest")
	if _, err := New(Options{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("unknown tier name: got %v", err)
	}
}

// TestPinAndDeviceMemoryOnCPU: pinning is a no-op on host memory and the cpu backend has no
// device memory figures.
func TestPinAndDeviceMemoryOnCPU(t *testing.T) {
	rt := newTestRuntime(t, Options{Backend: "cpu"})
	buf := make([]byte, 1<<20)
	if err := rt.PinHost(buf); err != nil {
		t.Fatalf("pin: %v", err)
	}
	if err := rt.UnpinHost(buf); err != nil {
		t.Fatalf("unpin: %v", err)
	}
	if _, _, err := rt.DeviceMemory(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("device memory on cpu: got %v, want ErrUnsupported", err)
	}
}

// TestFindDBOption: the cuDNN find database travels in the backend's config (a cpu backend
// takes it and has no use for it); a path the config cannot hold is an invalid argument.
func TestFindDBOption(t *testing.T) {
	newTestRuntime(t, Options{Backend: "cpu", FindDB: "/var/cache/fp/conv.json.cudnn-find"})
	if _, err := New(Options{Backend: "cpu", FindDB: "/" + strings.Repeat("x", 600)}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a 601-byte find database path: %v, want an invalid argument", err)
	}
}
