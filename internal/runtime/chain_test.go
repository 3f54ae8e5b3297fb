package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/convcache"
)

// convFixture is one small conv with its reference output.
type convFixture struct {
	x, w, b *Tensor
	p       Conv3dParams
	want    []float64
	shape   []int
}

func newConvFixture(t *testing.T, rt *Runtime) convFixture {
	t.Helper()
	r := rng(t)
	xs, ws := []int{1, 3, 3, 6, 5}, []int{4, 3, 3, 3, 3}
	x, xv := randTensor(t, rt, r, xs...)
	w, wv := randTensor(t, rt, r, ws...)
	b, bv := randTensor(t, rt, r, ws[0])
	p := Conv3dParams{Padding: [3]int{1, 1, 1}}
	want, shape := refConv3d(xv, xs, wv, ws, bv, p)
	return convFixture{x: x, w: w, b: b, p: p, want: want, shape: shape}
}

func (f convFixture) run(t *testing.T, rt *Runtime) {
	t.Helper()
	y, err := rt.Conv3d(f.x, f.w, f.b, f.p)
	check(t, "conv3d", y, err, f.shape, f.want)
}

func openCache(t *testing.T) *convcache.Cache {
	t.Helper()
	c, err := convcache.Open(filepath.Join(t.TempDir(), "conv-decisions.json"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func tierCounts(s ConvStats, t Tier) [6]int64 {
	ts := s.Tiers[t]
	return [6]int64{ts.Attempts, ts.Successes, ts.Failures, ts.Unavailable, ts.SkippedHung, ts.SkippedFailed}
}

func TestConvChainFallThrough(t *testing.T) {
	cache := openCache(t)
	rt := newTestRuntime(t, Options{
		ConvCache: cache,
		ConvFaults: []ConvFault{
			{Tier: TierVendorTuned, Mode: FaultFail},
			{Tier: TierVendorDefault, Mode: FaultServe},
		},
	})
	f := newConvFixture(t, rt)
	key := rt.ConvKey(f.x, f.w, f.p)

	f.run(t, rt) // tuned fails → default serves
	s := rt.ConvStats()
	if got, want := tierCounts(s, TierVendorTuned), [6]int64{1, 0, 1, 0, 0, 0}; got != want {
		t.Fatalf("vendor_tuned after 1st conv: %v, want %v", got, want)
	}
	if got, want := tierCounts(s, TierVendorDefault), [6]int64{1, 1, 0, 0, 0, 0}; got != want {
		t.Fatalf("vendor_default after 1st conv: %v, want %v", got, want)
	}
	if got := tierCounts(s, TierCPU); got != [6]int64{} {
		t.Fatalf("cpu must not be reached: %v", got)
	}
	if s.Decisions[key] != TierVendorDefault {
		t.Fatalf("decision %v, want vendor_default", s.Decisions[key])
	}
	e, ok := cache.Lookup(key)
	if !ok || e.Served != "vendor_default" {
		t.Fatalf("cache entry %+v, want served vendor_default", e)
	}
	if _, failed := e.FailedAt("vendor_tuned"); !failed {
		t.Fatalf("cache entry %+v does not record the vendor_tuned failure", e)
	}

	f.run(t, rt) // the recorded failure is skipped now
	s = rt.ConvStats()
	if got, want := tierCounts(s, TierVendorTuned), [6]int64{1, 0, 1, 0, 0, 1}; got != want {
		t.Fatalf("vendor_tuned after 2nd conv: %v, want %v", got, want)
	}
	if s.Convs != 2 || s.Served != 2 || s.Tiers[TierOwnKernel].Unavailable != 0 {
		t.Fatalf("stats after 2 convs: %+v", s)
	}
	block := s.String()
	for _, want := range []string{"conv fallback statistics", "vendor_tuned", "skipped-hung", "2 convs"} {
		if !strings.Contains(block, want) {
			t.Fatalf("statistics block lacks %q:\n%s", want, block)
		}
	}
	t.Log("\n" + block)
}

// TestConvChainRetryAndPolicy: RetryFailed, FirstTier, TierOverrides and keyed faults, on the cpu
// backend, whose only real tier is cpu (the faults stand in for a GPU library's tiers and the
// shape keys name cpu:0).
func TestConvChainRetryAndPolicy(t *testing.T) {
	t.Run("retry failed", func(t *testing.T) {
		rt := newTestRuntime(t, Options{
			Backend:    "cpu",
			ConvPolicy: ConvPolicy{RetryFailed: true},
			ConvFaults: []ConvFault{{Tier: TierVendorTuned, Mode: FaultFail}},
		})
		f := newConvFixture(t, rt)
		f.run(t, rt)
		f.run(t, rt)
		s := rt.ConvStats()
		if got, want := tierCounts(s, TierVendorTuned), [6]int64{2, 0, 2, 0, 0, 0}; got != want {
			t.Fatalf("vendor_tuned: %v, want %v", got, want)
		}
		if s.Tiers[TierVendorDefault].Unavailable != 2 || s.Tiers[TierCPU].Successes != 2 {
			t.Fatalf("stats: %+v", s)
		}
	})
	t.Run("first tier", func(t *testing.T) {
		rt := newTestRuntime(t, Options{
			Backend:    "cpu",
			ConvPolicy: ConvPolicy{FirstTier: TierCPU},
			ConvFaults: []ConvFault{{Tier: TierVendorTuned, Mode: FaultServe}},
		})
		f := newConvFixture(t, rt)
		f.run(t, rt)
		s := rt.ConvStats()
		if s.Tiers[TierVendorTuned].SkippedPolicy != 1 || s.Tiers[TierVendorTuned].Attempts != 0 ||
			s.Tiers[TierCPU].Successes != 1 {
			t.Fatalf("stats: %+v", s)
		}
	})
	t.Run("tier overrides", func(t *testing.T) {
		// vendor_tuned serves every shape (a stand-in for a GPU library), except the fixture's
		// shape, which its override sends to the cpu tier
		xs, ws := []int{1, 3, 3, 6, 5}, []int{4, 3, 3, 3, 3}
		key := convKey("cpu", 0, xs, ws, F32, F32, Conv3dParams{Padding: [3]int{1, 1, 1}}.norm())
		rt := newTestRuntime(t, Options{
			Backend:    "cpu",
			ConvPolicy: ConvPolicy{TierOverrides: map[string]Tier{key: TierCPU, "conv3d x=1x1 other": TierOwnKernel}},
			ConvFaults: []ConvFault{{Tier: TierVendorTuned, Mode: FaultServe}},
		})
		f := newConvFixture(t, rt)
		if got := rt.ConvKey(f.x, f.w, f.p); got != key {
			t.Fatalf("key %q, want %q", got, key)
		}
		f.run(t, rt)
		s := rt.ConvStats()
		if s.Tiers[TierVendorTuned].SkippedPolicy != 1 || s.Tiers[TierVendorTuned].Attempts != 0 ||
			s.Tiers[TierCPU].Successes != 1 || s.Decisions[key] != TierCPU {
			t.Fatalf("overridden shape: %+v", s)
		}
		r := rng(t)
		x, _ := randTensor(t, rt, r, 1, 3, 2, 4, 4)
		y, err := rt.Conv3d(x, f.w, nil, f.p)
		if err != nil {
			t.Fatal(err)
		}
		y.Free()
		if s := rt.ConvStats(); s.Tiers[TierVendorTuned].Successes != 1 || s.Decisions[rt.ConvKey(x, f.w, f.p)] != TierVendorTuned {
			t.Fatalf("shape without an override: %+v", s)
		}
	})
	t.Run("first tier is a floor for overrides", func(t *testing.T) {
		xs, ws := []int{1, 3, 3, 6, 5}, []int{4, 3, 3, 3, 3}
		key := convKey("cpu", 0, xs, ws, F32, F32, Conv3dParams{Padding: [3]int{1, 1, 1}}.norm())
		rt := newTestRuntime(t, Options{
			Backend:    "cpu",
			ConvPolicy: ConvPolicy{FirstTier: TierCPU, TierOverrides: map[string]Tier{key: TierVendorTuned}},
			ConvFaults: []ConvFault{{Tier: TierVendorTuned, Mode: FaultServe}},
		})
		newConvFixture(t, rt).run(t, rt)
		if s := rt.ConvStats(); s.Tiers[TierVendorTuned].Attempts != 0 || s.Tiers[TierCPU].Successes != 1 {
			t.Fatalf("an override above the forced tier applied: %+v", s)
		}
	})
	t.Run("bad overrides", func(t *testing.T) {
		for _, o := range []map[string]Tier{{"": TierCPU}, {"k": NumTiers}, {"k": -1}} {
			if _, err := New(Options{ConvPolicy: ConvPolicy{TierOverrides: o}}); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("overrides %v: got %v, want ErrInvalidArgument", o, err)
			}
		}
	})
	t.Run("fault on another shape", func(t *testing.T) {
		rt := newTestRuntime(t, Options{
			Backend:    "cpu",
			ConvFaults: []ConvFault{{Key: "conv3d x=9x9 other", Tier: TierCPU, Mode: FaultFail}},
		})
		f := newConvFixture(t, rt)
		f.run(t, rt)
		if s := rt.ConvStats(); s.Tiers[TierCPU].Successes != 1 {
			t.Fatalf("a fault keyed to another shape fired: %+v", s)
		}
	})
}

// TestConvChainAllTiersFail: on the cpu backend (cpu is its only real tier) a failing cpu tier
// leaves no tier to serve.
func TestConvChainAllTiersFail(t *testing.T) {
	cache := openCache(t)
	rt := newTestRuntime(t, Options{
		Backend:    "cpu",
		ConvCache:  cache,
		ConvFaults: []ConvFault{{Tier: TierCPU, Mode: FaultFail}},
	})
	f := newConvFixture(t, rt)
	_, err := rt.Conv3d(f.x, f.w, f.b, f.p)
	if !errors.Is(err, ErrNoConvTier) || !strings.Contains(err.Error(), "injected failure at tier cpu") {
		t.Fatalf("got %v, want ErrNoConvTier naming the cpu failure", err)
	}
	s := rt.ConvStats()
	if s.Failed != 1 || s.Served != 0 || s.Tiers[TierCPU].Failures != 1 {
		t.Fatalf("stats: %+v", s)
	}
	// the second time the recorded failure is skipped, and the error says so
	_, err = rt.Conv3d(f.x, f.w, f.b, f.p)
	if !errors.Is(err, ErrNoConvTier) || !strings.Contains(err.Error(), "skipped, failed before") {
		t.Fatalf("got %v, want ErrNoConvTier with the skip", err)
	}
}

// TestConvChainHangReleased: a tier hangs; the op observer and CurrentOp name the shape and the
// tier while it blocks; when the hang is released it counts as a failure and the next tier
// serves. On the cpu backend, where vendor_default is unavailable.
func TestConvChainHangReleased(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var events []OpEvent
	rt := newTestRuntime(t, Options{
		Backend: "cpu",
		ConvFaults: []ConvFault{
			{Tier: TierVendorTuned, Mode: FaultHang, Release: release},
			{Tier: TierOwnKernel, Mode: FaultServe},
		},
		OpObserver: func(e OpEvent) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		},
	})
	f := newConvFixture(t, rt)
	key := rt.ConvKey(f.x, f.w, f.p)
	done := make(chan error, 1)
	go func() {
		y, err := rt.Conv3d(f.x, f.w, f.b, f.p)
		if err == nil {
			y.Free()
		}
		done <- err
	}()
	deadline := time.After(10 * time.Second)
	for {
		cur, ok := rt.CurrentOp()
		if ok && cur.Op == "conv3d" && cur.Tier == TierVendorTuned {
			if cur.Key != key {
				t.Fatalf("current op key %q, want %q", cur.Key, key)
			}
			break
		}
		select {
		case <-deadline:
			t.Fatal("the hang never showed in CurrentOp")
		case <-time.After(time.Millisecond):
		}
	}
	select {
	case err := <-done:
		t.Fatalf("conv returned while hung: %v", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("conv after the release: %v", err)
	}
	s := rt.ConvStats()
	if s.Tiers[TierVendorTuned].Failures != 1 || s.Tiers[TierVendorDefault].Unavailable != 1 ||
		s.Tiers[TierOwnKernel].Successes != 1 {
		t.Fatalf("stats: %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	var conv []string
	for _, e := range events {
		if e.Op == "conv3d" {
			conv = append(conv, fmt.Sprintf("%d:%s", e.Phase, e.Tier))
		}
	}
	if got, want := strings.Join(conv, " "), "0:vendor_tuned 1:vendor_tuned 0:own_kernel 1:own_kernel"; got != want {
		t.Fatalf("conv op events %q, want %q", got, want)
	}
}

// TestConvHostBounce: the CPU tier of a backend without its own host conv (every GPU backend)
// downloads, convolves on a host backend and uploads: the cpu backend made to refuse its own
// conv tier stands in for one.
func TestConvHostBounce(t *testing.T) {
	rt := newTestRuntime(t, Options{Backend: "cpu", hostBounce: true})
	if tiers := rt.Backend().ConvTiers; len(tiers) != 1 || tiers[0] != TierCPU {
		t.Fatalf("backend reports tiers %v, want only cpu (served by the core)", tiers)
	}
	f := newConvFixture(t, rt)
	f.run(t, rt)
	if s := rt.ConvStats(); s.Tiers[TierCPU].Successes != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// ---- a real hang in a real process ------------------------------------------------------------

const (
	envChild  = "FPK_RUNTIME_CHAIN_CHILD" // "hang" or "skip"
	envCache  = "FPK_RUNTIME_CHAIN_CACHE"
	envBeacon = "FPK_RUNTIME_CHAIN_BEACON"
	envResult = "FPK_RUNTIME_CHAIN_RESULT"
)

type childResult struct {
	Key   string
	Stats ConvStats
	Err   string
}

// TestChainChild is the body of the child processes of TestConvHangAcrossProcesses; it does
// nothing when run directly.
func TestChainChild(t *testing.T) {
	mode := os.Getenv(envChild)
	if mode == "" {
		t.Skip("child of TestConvHangAcrossProcesses")
	}
	cache, err := convcache.Open(os.Getenv(envCache))
	if err != nil {
		t.Fatal(err)
	}
	beacon := os.Getenv(envBeacon)
	rt := newTestRuntime(t, Options{
		ConvCache: cache,
		ConvFaults: []ConvFault{
			{Tier: TierVendorTuned, Mode: FaultHang}, // forever: only SIGKILL ends it
			{Tier: TierVendorDefault, Mode: FaultServe},
		},
		OpObserver: func(e OpEvent) {
			if e.Op == "conv3d" && e.Phase == OpBegin {
				// the beacon: which shape and tier the worker is in
				tmp := beacon + ".tmp"
				if err := os.WriteFile(tmp, []byte(e.Key+"\t"+e.Tier.String()), 0o600); err == nil {
					_ = os.Rename(tmp, beacon)
				}
			}
		},
	})
	f := newConvFixture(t, rt)
	res := childResult{Key: rt.ConvKey(f.x, f.w, f.p)}
	y, err := rt.Conv3d(f.x, f.w, f.b, f.p) // mode "hang": never returns
	if err != nil {
		res.Err = err.Error()
	} else {
		check(t, "conv3d in child", y, nil, f.shape, f.want)
	}
	res.Stats = rt.ConvStats()
	raw, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv(envResult), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestConvHangAcrossProcesses: a worker process hangs in a conv tier; the "watchdog" (this
// test) reads the shape and tier from the worker's beacon, SIGKILLs it and records the hang in
// the shared cache; a fresh worker process with the same faults skips the hung tier, and its
// statistics say so.
func TestConvHangAcrossProcesses(t *testing.T) {
	if os.Getenv(envChild) != "" {
		t.Skip("in a child")
	}
	dir := t.TempDir()
	cachePath := filepath.Join(dir, "conv-decisions.json")
	beacon := filepath.Join(dir, "beacon")
	child := func(mode, result string) *exec.Cmd {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestChainChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), envChild+"="+mode, envCache+"="+cachePath,
			envBeacon+"="+beacon, envResult+"="+result)
		return cmd
	}

	hung := child("hang", filepath.Join(dir, "hang.json"))
	var out strings.Builder
	hung.Stdout, hung.Stderr = &out, &out
	if err := hung.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- hung.Wait() }()
	var key, tier string
	deadline := time.After(60 * time.Second)
	for key == "" {
		select {
		case err := <-exited:
			t.Fatalf("hanging child exited: %v\n%s", err, out.String())
		case <-deadline:
			_ = hung.Process.Kill()
			t.Fatalf("no beacon from the hanging child\n%s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if raw, err := os.ReadFile(beacon); err == nil {
			k, tr, ok := strings.Cut(string(raw), "\t")
			if ok && tr == TierVendorTuned.String() {
				key, tier = k, tr
			}
		}
	}
	// make sure it is really stuck: still alive a moment later
	select {
	case err := <-exited:
		t.Fatalf("child exited instead of hanging: %v\n%s", err, out.String())
	case <-time.After(200 * time.Millisecond):
	}
	if err := hung.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	if _, err := os.Stat(filepath.Join(dir, "hang.json")); err == nil {
		t.Fatal("the hanging child finished its conv")
	}

	// the supervisor's part: record the hang in the shared cache, without any runtime
	cache, err := convcache.Open(cachePath)
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.MarkHung(key, tier); err != nil {
		t.Fatal(err)
	}

	resultPath := filepath.Join(dir, "skip.json")
	fresh := child("skip", resultPath)
	if raw, err := fresh.CombinedOutput(); err != nil {
		t.Fatalf("fresh child: %v\n%s", err, raw)
	}
	raw, err := os.ReadFile(resultPath)
	if err != nil {
		t.Fatal(err)
	}
	var res childResult
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	if res.Err != "" || res.Key != key {
		t.Fatalf("fresh child: key %q err %q, want key %q and no error", res.Key, res.Err, key)
	}
	s := res.Stats
	if s.Tiers[TierVendorTuned].SkippedHung != 1 || s.Tiers[TierVendorTuned].Attempts != 0 ||
		s.Tiers[TierVendorDefault].Successes != 1 || s.Decisions[key] != TierVendorDefault {
		t.Fatalf("fresh child's stats:\n%s", s)
	}
	if err := cache.Reload(); err != nil {
		t.Fatal(err)
	}
	e, _ := cache.Lookup(key)
	if !e.IsHung("vendor_tuned") || e.Served != "vendor_default" {
		t.Fatalf("cache entry after both workers: %+v", e)
	}
	t.Logf("fresh worker:\n%s", s)
}

// TestConcurrentOps: goroutines share one runtime (pool, allocator, conv chain and cache);
// every result is still right and the statistics add up. On any backend (FRAMEPACK_BACKEND).
func TestConcurrentOps(t *testing.T) {
	rt := newTestRuntime(t, Options{ConvCache: openCache(t)})
	f := newConvFixture(t, rt)
	r := rng(t)
	a, av := randTensor(t, rt, r, 33, 17)
	b, bv := randTensor(t, rt, r, 17)
	sum := make([]float64, len(av))
	for i := range av {
		sum[i] = av[i] + bv[i%17]
	}
	const workers, rounds = 4, 5
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				y, err := rt.Conv3d(f.x, f.w, f.b, f.p)
				if err != nil {
					errs <- err
					return
				}
				got, err := y.Float32()
				y.Free()
				if err != nil {
					errs <- err
					return
				}
				if e := relL2(got, f.want); e > tol {
					errs <- fmt.Errorf("conv rel L2 %g", e)
					return
				}
				z, err := rt.Add(a, b)
				if err != nil {
					errs <- err
					return
				}
				got, err = z.Float32()
				z.Free()
				if err != nil {
					errs <- err
					return
				}
				if e := relL2(got, sum); e > tol {
					errs <- fmt.Errorf("add rel L2 %g", e)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := rt.ConvStats()
	if s.Convs != workers*rounds || s.Served != workers*rounds || s.Failed != 0 {
		t.Fatalf("stats: %+v", s)
	}
	// on the cpu backend its own tier serves every conv (a GPU backend's vendor tiers come first)
	if rt.Backend().Name == "cpu" && s.Tiers[TierCPU].Successes != workers*rounds {
		t.Fatalf("cpu backend, cpu tier did not serve every conv: %+v", s)
	}
}

// TestConvFirstRunSynchronised: the first run of a tier for a shape is synchronised (counted
// in FirstSyncs), later runs of the same shape are not, a new shape is again.
func TestConvFirstRunSynchronised(t *testing.T) {
	rt := newTestRuntime(t, Options{Backend: "cpu"})
	f := newConvFixture(t, rt)
	f.run(t, rt)
	f.run(t, rt)
	if n := rt.ConvStats().Tiers[TierCPU].FirstSyncs; n != 1 {
		t.Fatalf("%d first-run syncs after two convs of one shape, want 1", n)
	}
	g := f
	g.p = Conv3dParams{Padding: [3]int{0, 1, 1}}
	y, err := rt.Conv3d(g.x, g.w, g.b, g.p)
	if err != nil {
		t.Fatal(err)
	}
	y.Free()
	if n := rt.ConvStats().Tiers[TierCPU].FirstSyncs; n != 2 {
		t.Fatalf("%d first-run syncs after a second shape, want 2", n)
	}
	// per shape: the serving tier, the calls, the synchronised first run within the total
	s := rt.ConvStats()
	a, b := s.Shapes[rt.ConvKey(f.x, f.w, f.p)], s.Shapes[rt.ConvKey(g.x, g.w, g.p)]
	if len(s.Shapes) != 2 || a.Tier != TierCPU || a.Calls != 2 || b.Calls != 1 || a.First <= 0 || a.First > a.Time || b.First <= 0 {
		t.Fatalf("shape stats %+v", s.Shapes)
	}
}

// TestPCIBusIDOption: a bus id that cannot fit the C config is refused; on cpu a valid one is
// ignored (the GPU backends open the device it names: native/gpu/fpk_gpu_device.cu).
func TestPCIBusIDOption(t *testing.T) {
	if _, err := New(Options{Backend: "cpu", PCIBusID: strings.Repeat("0", 40)}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("40-character bus id: %v", err)
	}
	rt := newTestRuntime(t, Options{Backend: "cpu", PCIBusID: "0000:65:00.0"})
	if rt.info.Name != "cpu" {
		t.Fatalf("backend %q", rt.info.Name)
	}
}

// TestConvKeyInputView: a conv without an input view keeps the decision-cache key it had before
// views existed (an unset and a unit upsampling alike), and different views get different keys.
func TestConvKeyInputView(t *testing.T) {
	xs, ws := []int{1, 8, 5, 12, 20}, []int{8, 8, 3, 3, 3}
	key := func(p Conv3dParams) string { return convKey("cpu", 0, xs, ws, F32, F32, p.norm()) }
	const old = "conv3d x=1x8x5x12x20 w=8x8x3x3x3 s=1x1x1 p=0x0x0 g=1 f32/f32 cpu:0"
	if got := key(Conv3dParams{}); got != old {
		t.Errorf("no view: %q, want %q", got, old)
	}
	if got := key(Conv3dParams{Input: ConvInput{Upsample: [3]int{1, 1, 1}}}); got != old {
		t.Errorf("unit upsampling: %q, want %q", got, old)
	}
	causal := ConvInput{Replicate: Pad3d{Before: [3]int{2, 1, 1}, After: [3]int{0, 1, 1}}}
	up := ConvInput{Upsample: [3]int{2, 2, 2}, Replicate: Pad3d{Before: [3]int{1, 1, 1}, After: [3]int{0, 1, 1}}}
	kc, ku := key(Conv3dParams{Input: causal}), key(Conv3dParams{Input: up})
	if want := "conv3d x=1x8x5x12x20 w=8x8x3x3x3 s=1x1x1 p=0x0x0 g=1 up=1x1x1 rb=2x1x1 ra=0x1x1 f32/f32 cpu:0"; kc != want {
		t.Errorf("causal view: %q, want %q", kc, want)
	}
	if kc == ku || kc == old || ku == old {
		t.Errorf("views share a key: %q, %q, %q", old, kc, ku)
	}
}
