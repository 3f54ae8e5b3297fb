package modelrt

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// newBase returns a Base with a real beacon page, and the page to read it.
func newBase(t *testing.T, conv bool) (*Base, *beacon.Page) {
	t.Helper()
	page, err := beacon.NewPage()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { page.Close() })
	bw, err := beacon.Attach(page.File())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bw.Close() })
	log, _ := test.NewNullLogger()
	return New(&workerkit.Kit{Name: "test", Log: logrus.NewEntry(log), Beacon: bw}, Config{Name: "test", Conv: conv}), page
}

// runConv runs one 1×1×1 conv3d and one unary op on rt.
func runConv(t *testing.T, rt *runtime.Runtime) {
	t.Helper()
	x, err := rt.FromFloat32(make([]float32, 2*4*4), 1, 2, 1, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	w, err := rt.FromFloat32([]float32{1, 0, 0, 1}, 2, 2, 1, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Free()
	y, err := rt.Conv3d(x, w, nil, runtime.Conv3dParams{Stride: [3]int{1, 1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer y.Free()
	z, err := rt.Unary(runtime.OpSiLU, y)
	if err != nil {
		t.Fatal(err)
	}
	z.Free()
}

// TestRuntimeAndStats starts a runtime for a LoadRequest with a conv policy, runs ops and checks
// the beacon, the LoadResponse and Stats: with Config.Conv the beacon names the conv's shape and
// tier and the forced tier serves it; without, the policy is ignored and the beacon names none.
func TestRuntimeAndStats(t *testing.T) {
	for _, conv := range []bool{true, false} {
		t.Run(fmt.Sprintf("conv=%v", conv), func(t *testing.T) {
			b, page := newBase(t, conv)
			req := &workerkit.LoadRequest{MemoryCapBytes: 1 << 30,
				ConvPolicy: &workerkit.ConvPolicy{ForcedTier: workerkit.ConvTierCPU, DecisionCachePath: filepath.Join(t.TempDir(), "conv.json")}}
			start := time.Now()
			rt, err := b.newRuntime(req, runtime.Options{Backend: "cpu"})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			resp := b.Loaded(rt, start, 1234)
			if resp.Backend != "cpu" || resp.DType != "fp32" || resp.WeightBytes != 1234 || resp.Device == nil || resp.Device.Arch == "" {
				t.Fatalf("load response %+v %+v", resp, resp.Device)
			}
			runConv(t, rt)
			snap, err := page.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if snap.OpSeq < 2 || snap.InOp || snap.Op == "" {
				t.Fatalf("beacon %+v", snap)
			}
			st := b.Stats()
			if st.OpCounts["conv3d"] != 1 || st.MemoryCapBytes != 1<<30 || st.AllocatorPeakBytes == 0 || st.HostRSSBytes == 0 || st.LoadTime <= 0 {
				t.Fatalf("stats %+v", st)
			}
			if len(st.ConvTiers) != 1 || st.ConvTiers[0].Tier != workerkit.ConvTierCPU || st.ConvTiers[0].Successes != 1 {
				t.Fatalf("conv tiers %+v", st.ConvTiers)
			}
			var total uint64
			for _, n := range st.OpCounts {
				total += n
			}
			if total != snap.OpSeq {
				t.Errorf("op counts %v add up to %d, the beacon counted %d", st.OpCounts, total, snap.OpSeq)
			}
			if _, err := os.Stat(req.ConvPolicy.DecisionCachePath); (err == nil) != conv {
				t.Errorf("decision cache written: %v, want %v", err == nil, conv)
			}
		})
	}
}

// TestNewRuntimeRefusals checks that requests the runtime cannot honour are invalid arguments.
func TestNewRuntimeRefusals(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		conv bool
		req  workerkit.LoadRequest
		want string
	}{
		{"memory cap", true, workerkit.LoadRequest{MemoryCapBytes: math.MaxUint64}, "memory cap"},
		{"override without tier", true, workerkit.LoadRequest{ConvPolicy: &workerkit.ConvPolicy{
			TierOverrides: []workerkit.ConvTierOverride{{ShapeKey: "k"}}}}, "shape key and tier"},
		{"forced tier out of range", true, workerkit.LoadRequest{ConvPolicy: &workerkit.ConvPolicy{ForcedTier: 9}}, "forced tier 9"},
		{"decision cache path", true, workerkit.LoadRequest{ConvPolicy: &workerkit.ConvPolicy{
			DecisionCachePath: filepath.Join(notDir, "conv.json")}}, "conv decision cache"},
		{"conv fault without convs", false, workerkit.LoadRequest{Fault: &workerkit.Fault{HangConvTier: workerkit.ConvTierCPU}}, "hang_conv_tier"},
		{"bad exit signal", true, workerkit.LoadRequest{Fault: &workerkit.Fault{ExitSignal: 99}}, "exit_signal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newBase(t, tc.conv)
			rt, err := b.newRuntime(&tc.req, runtime.Options{Backend: "cpu"})
			if err == nil {
				rt.Close()
				t.Fatal("runtime started")
			}
			if c := Classify(err); workerkit.CodeOf(c) != workerkit.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v (%v), want an invalid argument saying %q", err, workerkit.CodeOf(c), tc.want)
			}
		})
	}
}

// TestConvEvents checks the fallback events the observer queues: a tier that fails (not one
// the backend lacks), then the tier that serves the shape.
func TestConvEvents(t *testing.T) {
	b, _ := newBase(t, true)
	end := func(key string, tier runtime.Tier, err error) {
		b.Observe(runtime.OpEvent{Phase: runtime.OpBegin, Op: "conv3d", Key: key, Tier: tier})
		b.Observe(runtime.OpEvent{Phase: runtime.OpEnd, Op: "conv3d", Key: key, Tier: tier, Err: err})
	}
	end("k", runtime.TierVendorTuned, runtime.ErrUnavailable)
	end("k", runtime.TierVendorDefault, errors.New("miopen: bad algo"))
	end("k", runtime.TierOwnKernel, nil)
	end("k", runtime.TierOwnKernel, nil) // a later conv of the shape: nothing to report
	ev := b.DrainConvEvents()
	if len(ev) != 2 || ev[0].Outcome != workerkit.ConvOutcomeFailed || ev[0].Tier != workerkit.ConvTierVendorDefault ||
		ev[0].Detail != "miopen: bad algo" || ev[1].Outcome != workerkit.ConvOutcomeSucceeded || ev[1].Tier != workerkit.ConvTierOwnKernel {
		t.Fatalf("events %+v", ev)
	}
	if again := b.DrainConvEvents(); len(again) != 0 {
		t.Fatalf("events after drain: %+v", again)
	}
	if n := b.Stats().OpCounts["conv3d"]; n != 4 {
		t.Errorf("conv3d counted %d times, want 4", n)
	}
}

func TestClassify(t *testing.T) {
	errModel := errors.New("bad checkpoint")
	tests := []struct {
		name string
		err  error
		want workerkit.ErrorCode
	}{
		{"already classified", fmt.Errorf("load: %w", workerkit.Errorf(workerkit.CodeDeviceLost, "gone")), workerkit.CodeDeviceLost},
		{"out of memory", fmt.Errorf("op: %w", &runtime.OOMError{Requested: 10, Available: 5}), workerkit.CodeOutOfMemory},
		{"device lost", fmt.Errorf("op: %w", runtime.ErrDeviceLost), workerkit.CodeDeviceLost},
		{"model's bad input", fmt.Errorf("load: %w", errModel), workerkit.CodeInvalidArgument},
		{"request", workerkit.InvalidArgumentf("steps %d", 0), workerkit.CodeInvalidArgument},
		{"cancelled", fmt.Errorf("step: %w", context.Canceled), workerkit.CodeCancelled},
		{"deadline", context.DeadlineExceeded, workerkit.CodeCancelled},
		{"other", errors.New("boom"), workerkit.CodeInternal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify(tc.err, errModel)
			var we *workerkit.Error
			if !errors.As(got, &we) || we.Code != tc.want || got.Error() != tc.err.Error() {
				t.Fatalf("Classify(%v) = %v (%v), want code %v", tc.err, got, workerkit.CodeOf(got), tc.want)
			}
		})
	}
	if oom := Classify(&runtime.OOMError{Requested: 10, Available: 5}).(*workerkit.Error); oom.RequestedBytes != 10 || oom.AvailableBytes != 5 {
		t.Errorf("out of memory sizes %+v", oom)
	}
	if Classify(nil) != nil {
		t.Error("Classify(nil) is not nil")
	}
	// A model that does not load will not load on a retry, unless memory ran out.
	if c := workerkit.CodeOf(ClassifyLoad(errors.New("no config.json"))); c != workerkit.CodeInvalidArgument {
		t.Errorf("load error: %v", c)
	}
	if c := workerkit.CodeOf(ClassifyLoad(fmt.Errorf("load: %w", &runtime.OOMError{}))); c != workerkit.CodeOutOfMemory {
		t.Errorf("load out of memory: %v", c)
	}
}

func TestRuntimeOptions(t *testing.T) {
	for _, b := range []string{"", "auto", "cpu", "cuda", "hip"} {
		opts, err := runtimeOptions(&workerkit.LoadRequest{Backend: b, DeviceIndex: 2, PCIBusID: "0000:65:00.0"})
		if err != nil || opts.Backend != b || opts.Device != 2 || opts.PCIBusID != "0000:65:00.0" {
			t.Errorf("%q: %+v %v", b, opts, err)
		}
	}
	for _, b := range []string{"vulkan", "../lib", "CPU"} {
		_, err := runtimeOptions(&workerkit.LoadRequest{Backend: b})
		if workerkit.CodeOf(err) != workerkit.CodeInvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("%q", b)) {
			t.Errorf("%q: %v", b, err)
		}
	}
	if _, err := runtimeOptions(&workerkit.LoadRequest{DeviceIndex: math.MaxInt32 + 1}); workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
		t.Errorf("device index beyond int32: %v", err)
	}
}

// TestFindDB: a worker that convolves keeps its cuDNN Find results beside the conv decision
// cache; the cpu and a worker without a cache get none. The runtime gets it in its options (the
// backend's config), not from the environment.
func TestFindDB(t *testing.T) {
	policy := &workerkit.ConvPolicy{DecisionCachePath: "/var/cache/fp/conv.json"}
	for _, tc := range []struct {
		name string
		req  workerkit.LoadRequest
		want string
	}{
		{name: "beside the cache", req: workerkit.LoadRequest{Backend: "cuda", ConvPolicy: policy}, want: "/var/cache/fp/conv.json.cudnn-find"},
		{name: "auto may be cuda", req: workerkit.LoadRequest{Backend: "auto", ConvPolicy: policy}, want: "/var/cache/fp/conv.json.cudnn-find"},
		{name: "no cache", req: workerkit.LoadRequest{Backend: "cuda"}},
		{name: "cpu", req: workerkit.LoadRequest{Backend: "cpu", ConvPolicy: policy}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FindDB(&tc.req); got != tc.want {
				t.Errorf("find db %q, want %q", got, tc.want)
			}
		})
	}
}

// TestChooseDTypes: the activation dtype comes from the request, else the environment, else the
// model's GPU default on a GPU and f32 on the cpu; the weights follow it unless the request's
// dtype names them; bad names are invalid arguments naming their source.
func TestChooseDTypes(t *testing.T) {
	tests := []struct {
		name         string
		req          workerkit.LoadRequest
		env          string
		host         bool
		act, weights runtime.DType
		err          string
	}{
		{name: "cpu default", host: true, act: runtime.F32, weights: runtime.F32},
		{name: "gpu default", act: runtime.BF16, weights: runtime.BF16},
		{name: "gpu default, weights as stored", req: workerkit.LoadRequest{DType: "auto"}, act: runtime.BF16, weights: runtime.AsStored},
		{name: "env forces f32 on a gpu", env: "f32", act: runtime.F32, weights: runtime.F32},
		{name: "env forces fp16 on the cpu", env: "fp16", host: true, act: runtime.F16, weights: runtime.F16},
		{name: "request beats env", req: workerkit.LoadRequest{ActivationDType: "fp32"}, env: "bf16", act: runtime.F32, weights: runtime.F32},
		{name: "request weights differ", req: workerkit.LoadRequest{ActivationDType: "bf16", DType: "fp32"}, host: true, act: runtime.BF16, weights: runtime.F32},
		{name: "bad request name", req: workerkit.LoadRequest{ActivationDType: "int8"}, err: "activation_dtype"},
		{name: "bad env name", env: "half", err: ActivationEnv},
		{name: "bad weight name", req: workerkit.LoadRequest{DType: "int8"}, err: "dtype"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			act, w, err := chooseDTypes(&tc.req, tc.env, tc.host, runtime.BF16)
			if tc.err != "" {
				if !errors.Is(err, workerkit.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want an invalid argument naming %s", err, tc.err)
				}
				return
			}
			if err != nil || act != tc.act || w != tc.weights {
				t.Fatalf("got %s, %s, %v; want %s, %s", act, w, err, tc.act, tc.weights)
			}
		})
	}
}

// TestLoadedReportsActivation: LoadResponse.dtype is the activation dtype Activation chose.
func TestLoadedReportsActivation(t *testing.T) {
	b, _ := newBase(t, false)
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if got := b.Loaded(rt, time.Now(), 0).DType; got != "fp32" {
		t.Fatalf("before Activation: %q, want fp32", got)
	}
	if _, _, err := b.Activation(&workerkit.LoadRequest{ActivationDType: "bf16"}, rt, runtime.F16); err != nil {
		t.Fatal(err)
	}
	if got := b.Loaded(rt, time.Now(), 0).DType; got != "bf16" {
		t.Fatalf("after Activation bf16: %q", got)
	}
}
