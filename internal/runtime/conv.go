package runtime

/*
#include "fpk.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/framepackd/framepackd/internal/convcache"
)

// Tier is one implementation level of the conv fallback chain, tried in this order.
type Tier int

// Conv tiers.
const (
	TierVendorTuned   Tier = C.FPK_CONV_TIER_VENDOR_TUNED   // MIOpen Find / cuDNN FindEx
	TierVendorDefault Tier = C.FPK_CONV_TIER_VENDOR_DEFAULT // MIOpen immediate / cuDNN heuristics
	TierOwnKernel     Tier = C.FPK_CONV_TIER_OWN_KERNEL     // our own GPU kernel
	TierCPU           Tier = C.FPK_CONV_TIER_CPU            // OpenBLAS im2col + GEMM on the host
	NumTiers          Tier = C.FPK_CONV_TIER_COUNT
)

var tierNames = [NumTiers]string{"vendor_tuned", "vendor_default", "own_kernel", "cpu"}

// String returns the tier's stable name, as written in the decision cache ("vendor_tuned").
func (t Tier) String() string {
	if t >= 0 && t < NumTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", int(t))
}

// MarshalText writes the tier's name (so JSON stats read "cpu", not 3).
func (t Tier) MarshalText() ([]byte, error) {
	if t < 0 || t >= NumTiers {
		return nil, fmt.Errorf("marshal tier %d: out of range", int(t))
	}
	return []byte(t.String()), nil
}

// UnmarshalText parses a tier's name.
func (t *Tier) UnmarshalText(b []byte) error {
	v, err := ParseTier(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// ParseTier is the inverse of Tier.String.
func ParseTier(s string) (Tier, error) {
	for i, n := range tierNames {
		if n == s {
			return Tier(i), nil
		}
	}
	return 0, fmt.Errorf("parse tier %q: unknown tier", s)
}

// Conv3dParams are a 3-D convolution's options. Zero stride means 1; padding is zero padding
// on both sides of (T, H, W); zero groups means 1. Input says how the conv reads x.
type Conv3dParams struct {
	Stride  [3]int
	Padding [3]int
	Groups  int
	Input   ConvInput
}

// ConvInput is the tensor a conv convolves, made from x: x upsampled (nearest) by Upsample
// (zero means 1), then replicate padded by Replicate, over (T, H, W) — UpsamplePad(x, Upsample,
// Replicate) without the copy. The VAE's causal convs (replicate padding) and its upsamplers'
// convs read it so: the cuda backend's channels-last path and the own kernel read x in place;
// elsewhere the native core makes the tensor for the call and frees it after (the same sums).
// The zero value is x itself.
type ConvInput struct {
	Upsample  [3]int
	Replicate Pad3d
}

// dim is the input's extent along dim i (T, H, W) when x has n there.
func (v ConvInput) dim(i, n int) int {
	return v.Replicate.Before[i] + max(v.Upsample[i], 1)*n + v.Replicate.After[i]
}

func (v ConvInput) identity() bool {
	return v == ConvInput{} || v == ConvInput{Upsample: [3]int{1, 1, 1}}
}

func (p Conv3dParams) norm() Conv3dParams {
	for i := range 3 {
		if p.Stride[i] == 0 {
			p.Stride[i] = 1
		}
		if p.Input.Upsample[i] == 0 {
			p.Input.Upsample[i] = 1
		}
	}
	if p.Groups == 0 {
		p.Groups = 1
	}
	return p
}

// c is p as the C ABI takes it.
func (p Conv3dParams) c() C.fpk_conv3d_params {
	cp := C.fpk_conv3d_params{groups: C.int64_t(p.Groups)}
	for i := range 3 {
		cp.stride[i] = C.int64_t(p.Stride[i])
		cp.padding[i] = C.int64_t(p.Padding[i])
		cp.upsample[i] = C.int64_t(p.Input.Upsample[i])
		cp.replicate_before[i] = C.int64_t(p.Input.Replicate.Before[i])
		cp.replicate_after[i] = C.int64_t(p.Input.Replicate.After[i])
	}
	return cp
}

// Conv2dParams are a 2-D convolution's options (H, W), as Conv3dParams.
type Conv2dParams struct {
	Stride  [2]int
	Padding [2]int
	Groups  int
}

// FaultMode is what an injected conv fault does.
type FaultMode int

// Fault modes.
const (
	// FaultFail makes the tier return an error.
	FaultFail FaultMode = iota
	// FaultHang makes the tier block: until Release is closed (then it fails), or forever when
	// Release is nil (a worker the watchdog must kill). The op observer has already been told
	// the shape key and tier when it blocks.
	FaultHang
	// FaultServe makes a tier the backend lacks serve the shape with the CPU implementation,
	// so a machine without a GPU has several working tiers to fall through.
	FaultServe
)

// String returns the mode's name.
func (m FaultMode) String() string {
	switch m {
	case FaultFail:
		return "fail"
	case FaultHang:
		return "hang"
	case FaultServe:
		return "serve"
	}
	return "fault?"
}

// ConvFault is a test hook: it changes what one tier does for one shape (or every shape).
type ConvFault struct {
	Key     string // conv shape key (Runtime.ConvKey); "" matches every shape
	Tier    Tier
	Mode    FaultMode
	Release <-chan struct{} // FaultHang: closing it ends the hang as a failure
}

func (f ConvFault) validate() error {
	if f.Tier < 0 || f.Tier >= NumTiers {
		return fmt.Errorf("tier %d out of range", int(f.Tier))
	}
	if f.Mode < FaultFail || f.Mode > FaultServe {
		return fmt.Errorf("unknown mode %d", int(f.Mode))
	}
	return nil
}

// ConvPolicy adjusts the chain (the worker's Load passes it from the supervisor).
type ConvPolicy struct {
	// FirstTier skips the tiers before it (a step down the degradation ladder).
	FirstTier Tier
	// RetryFailed tries tiers again that the cache records as failed for a shape (by default
	// they are skipped, as hung ones always are).
	RetryFailed bool
	// Only tries FirstTier and no later one: a conv that tier cannot serve fails (tests that
	// force each tier in turn; EnvConvTier sets it).
	Only bool
	// TierOverrides sets, per conv shape key (Runtime.ConvKey), the first tier to try for that
	// shape (LoadRequest.conv_policy.tier_overrides). FirstTier still skips the tiers above it
	// for every shape: the later of the two is where a shape starts (and, with Only, the one
	// tier it tries).
	TierOverrides map[string]Tier
}

// isZero reports whether p is the zero policy (the full chain for every shape).
func (p ConvPolicy) isZero() bool {
	return p.FirstTier == 0 && !p.RetryFailed && !p.Only && len(p.TierOverrides) == 0
}

// firstTier is the tier the chain starts at for the shape key.
func (p ConvPolicy) firstTier(key string) Tier {
	if o, ok := p.TierOverrides[key]; ok && o > p.FirstTier {
		return o
	}
	return p.FirstTier
}

func (p ConvPolicy) validate() error {
	if p.FirstTier < 0 || p.FirstTier >= NumTiers {
		return fmt.Errorf("first tier %d out of range", int(p.FirstTier))
	}
	for key, t := range p.TierOverrides {
		if key == "" {
			return fmt.Errorf("tier override with an empty shape key")
		}
		if t < 0 || t >= NumTiers {
			return fmt.Errorf("tier override for %q: tier %d out of range", key, int(t))
		}
	}
	return nil
}

// TierStats counts what one tier did.
type TierStats struct {
	Attempts      int64         // calls into the tier
	Successes     int64         // calls that served the conv
	Failures      int64         // calls that returned an error
	Unavailable   int64         // convs for which the backend lacks the tier
	SkippedHung   int64         // convs skipped because the cache records a hang there
	SkippedFailed int64         // convs skipped because the cache records a failure there
	SkippedPolicy int64         // convs skipped by ConvPolicy (FirstTier, TierOverrides, Only)
	FirstSyncs    int64         // first runs of the tier for a shape, synchronised (see attempt)
	Time          time.Duration // time spent in attempts
}

// ConvStats are the conv fallback chain's statistics.
type ConvStats struct {
	Backend     string // "cpu:0"
	Convs       int64  // convolutions asked for
	Served      int64  // convolutions some tier served
	Failed      int64  // convolutions no tier could serve
	CacheErrors int64  // failed writes to the decision cache
	Tiers       [NumTiers]TierStats
	// Decisions maps each shape key seen to the tier that last served it.
	Decisions map[string]Tier
	// Shapes says, per shape key served, which tier served it, how often and how long it took.
	Shapes map[string]ShapeStats
}

// ShapeStats is what the conv chain did for one shape key.
type ShapeStats struct {
	Tier  Tier  // the tier that last served it
	Calls int64 // convolutions of this shape served
	// First is the first run of the serving tier for the shape, synchronised (without the work
	// queued before it): for vendor_tuned it holds the vendor's Find (benchmarking the
	// algorithms), for vendor_default the algorithm query.
	First time.Duration
	// Time is the time in the serving tier over all calls (later calls as long as queuing
	// them took on an asynchronous device).
	Time time.Duration
}

// String formats the statistics as the "conv fallback statistics" block for logs and Stats.
func (s ConvStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "conv fallback statistics (%s): %d convs, %d served, %d failed, %d shapes",
		s.Backend, s.Convs, s.Served, s.Failed, len(s.Decisions))
	if s.CacheErrors > 0 {
		fmt.Fprintf(&b, ", %d cache write errors", s.CacheErrors)
	}
	b.WriteByte('\n')
	fmt.Fprintf(&b, "  %-15s %9s %9s %9s %11s %12s %14s %14s %12s\n", "tier", "attempts", "served",
		"failed", "unavailable", "skipped-hung", "skipped-failed", "skipped-policy", "time")
	for t := Tier(0); t < NumTiers; t++ {
		ts := s.Tiers[t]
		fmt.Fprintf(&b, "  %-15s %9d %9d %9d %11d %12d %14d %14d %12s\n", t, ts.Attempts, ts.Successes,
			ts.Failures, ts.Unavailable, ts.SkippedHung, ts.SkippedFailed, ts.SkippedPolicy,
			ts.Time.Round(time.Microsecond))
	}
	return b.String()
}

// convChain runs every conv through the tiers.
type convChain struct {
	rt    *Runtime
	tiers uint32 // bit per tier the backend has
	cache *convcache.Cache

	// mu protects stats, local and tried.
	mu    sync.Mutex
	st    ConvStats
	local map[string]convcache.Entry // decisions when there is no cache file
	tried map[string]bool            // shape key + tier pairs this process has run
	first map[string]time.Duration   // shape key + tier: its synchronised first run
}

func newConvChain(rt *Runtime, tiers uint32) *convChain {
	return &convChain{
		rt:    rt,
		tiers: tiers,
		cache: rt.opts.ConvCache,
		st: ConvStats{
			Backend:   fmt.Sprintf("%s:%d", rt.info.Name, rt.info.Device),
			Decisions: map[string]Tier{},
			Shapes:    map[string]ShapeStats{},
		},
		local: map[string]convcache.Entry{},
		tried: map[string]bool{},
		first: map[string]time.Duration{},
	}
}

// firstRun reports whether this is the process's first run of tier t for shape key, and
// records the run.
func (c *convChain) firstRun(key string, t Tier) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := key + "\x00" + t.String()
	if c.tried[k] {
		return false
	}
	c.tried[k] = true
	return true
}

func (c *convChain) stats() ConvStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.Decisions = make(map[string]Tier, len(c.st.Decisions))
	for k, v := range c.st.Decisions {
		s.Decisions[k] = v
	}
	s.Shapes = make(map[string]ShapeStats, len(c.st.Shapes))
	for k, v := range c.st.Shapes {
		s.Shapes[k] = v
	}
	return s
}

func (c *convChain) count(f func(s *ConvStats)) {
	c.mu.Lock()
	f(&c.st)
	c.mu.Unlock()
}

func (c *convChain) lookup(key string) convcache.Entry {
	if c.cache != nil {
		e, _ := c.cache.Lookup(key)
		return e
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.local[key]
}

func (c *convChain) recordServed(key string, t Tier, prev convcache.Entry) {
	if prev.Served == t.String() {
		if _, failed := prev.FailedAt(t.String()); !failed {
			return
		}
	}
	if c.cache != nil {
		if err := c.cache.RecordServed(key, t.String()); err != nil {
			c.count(func(s *ConvStats) { s.CacheErrors++ })
		}
		return
	}
	c.mu.Lock()
	e := c.local[key]
	e.Served = t.String()
	delete(e.Failed, t.String())
	c.local[key] = e
	c.mu.Unlock()
}

func (c *convChain) recordFailed(key string, t Tier, reason string) {
	if c.cache != nil {
		if err := c.cache.RecordFailed(key, t.String(), reason); err != nil {
			c.count(func(s *ConvStats) { s.CacheErrors++ })
		}
		return
	}
	c.mu.Lock()
	e := c.local[key]
	if e.Failed == nil {
		e.Failed = map[string]string{}
	}
	e.Failed[t.String()] = reason
	c.local[key] = e
	c.mu.Unlock()
}

func (c *convChain) fault(key string, t Tier) (ConvFault, bool) {
	for _, f := range c.rt.opts.ConvFaults {
		if f.Tier == t && (f.Key == "" || f.Key == key) {
			return f, true
		}
	}
	return ConvFault{}, false
}

// ConvKey returns the decision-cache key of a conv: dims, dtype, stride, padding, groups, the
// input view when there is one (" up=… rb=… ra=…": a conv without one keeps the key it had
// before views existed), backend and device.
func (rt *Runtime) ConvKey(x, w *Tensor, p Conv3dParams) string {
	return convKey(rt.info.Name, rt.info.Device, x.shape, w.shape, x.dtype, w.dtype, p.norm())
}

func convKey(backend string, device int, xs, ws []int, xdt, wdt DType, p Conv3dParams) string {
	dims := func(s []int) string {
		parts := make([]string, len(s))
		for i, d := range s {
			parts[i] = fmt.Sprint(d)
		}
		return strings.Join(parts, "x")
	}
	view := ""
	if !p.Input.identity() {
		view = fmt.Sprintf(" up=%s rb=%s ra=%s", dims(p.Input.Upsample[:]), dims(p.Input.Replicate.Before[:]),
			dims(p.Input.Replicate.After[:]))
	}
	return fmt.Sprintf("conv3d x=%s w=%s s=%s p=%s g=%d%s %s/%s %s:%d", dims(xs), dims(ws),
		dims(p.Stride[:]), dims(p.Padding[:]), p.Groups, view, xdt, wdt, backend, device)
}

// Conv3d is a PyTorch Conv3d forward: x [N, Cin, T, H, W], w [Cout, Cin/groups, kT, kH, kW],
// bias [Cout] or nil → [N, Cout, T', H', W'] with zero padding. It runs through the fallback
// chain: vendor tuned → vendor default → own GPU kernel → CPU, skipping tiers the backend
// lacks and tiers the decision cache records as hung (or failed) for this shape. w may be F16
// or BF16 (weights kept in 16 bits; the CPU tier widens them to f32 as it goes).
func (rt *Runtime) Conv3d(x, w, bias *Tensor, p Conv3dParams) (*Tensor, error) {
	const op = "conv3d"
	if err := required(op, x, w); err != nil {
		return nil, err
	}
	p = p.norm()
	if x.Rank() != 5 || w.Rank() != 5 {
		return nil, argError(op, "x %s and w %s must have 5 dims", x, w)
	}
	if p.Groups < 1 || x.Dim(1)%p.Groups != 0 || w.Dim(0)%p.Groups != 0 || w.Dim(1)*p.Groups != x.Dim(1) {
		return nil, argError(op, "x %s, w %s and groups %d do not fit", x, w, p.Groups)
	}
	shape := []int{x.Dim(0), w.Dim(0), 0, 0, 0}
	for i := range 3 {
		if p.Stride[i] < 1 || p.Padding[i] < 0 {
			return nil, argError(op, "stride %v padding %v", p.Stride, p.Padding)
		}
		v := p.Input
		switch {
		case v.Upsample[i] < 1:
			return nil, argError(op, "input upsampling %v: factors must be at least 1", v.Upsample)
		case v.Replicate.Before[i] < 0 || v.Replicate.After[i] < 0:
			return nil, argError(op, "input replicate padding %v before, %v after: must not be negative",
				v.Replicate.Before, v.Replicate.After)
		case x.Dim(2+i) == 0 && v.Replicate.Before[i]+v.Replicate.After[i] > 0:
			return nil, argError(op, "replicate padding of x %s, empty in dim %d", x, 2+i)
		}
		span := v.dim(i, x.Dim(2+i)) + 2*p.Padding[i] - w.Dim(2+i)
		if span < 0 {
			return nil, argError(op, "kernel %s larger than padded input %s (padding %v, input %+v)", w, x, p.Padding, v)
		}
		shape[2+i] = span/p.Stride[i] + 1
	}
	hs, err := rt.handles(op, []*Tensor{x, w, bias})
	if err != nil {
		return nil, err
	}
	out, err := rt.newTensor(op, x.dtype, shape)
	if err != nil {
		return nil, err
	}
	if err := rt.chain.run(rt.ConvKey(x, w, p), p, hs, out); err != nil {
		out.Free()
		return nil, err
	}
	return out, nil
}

// Conv2d is a PyTorch Conv2d forward: x [N, Cin, H, W], w [Cout, Cin/groups, kH, kW] → run as
// Conv3d with T = 1.
func (rt *Runtime) Conv2d(x, w, bias *Tensor, p Conv2dParams) (*Tensor, error) {
	const op = "conv2d"
	if err := required(op, x, w); err != nil {
		return nil, err
	}
	if x.Rank() != 4 || w.Rank() != 4 {
		return nil, argError(op, "x %s and w %s must have 4 dims", x, w)
	}
	x5, err := x.Reshape(x.Dim(0), x.Dim(1), 1, x.Dim(2), x.Dim(3))
	if err != nil {
		return nil, err
	}
	defer x5.Free()
	w5, err := w.Reshape(w.Dim(0), w.Dim(1), 1, w.Dim(2), w.Dim(3))
	if err != nil {
		return nil, err
	}
	defer w5.Free()
	y5, err := rt.Conv3d(x5, w5, bias, Conv3dParams{
		Stride:  [3]int{1, p.Stride[0], p.Stride[1]},
		Padding: [3]int{0, p.Padding[0], p.Padding[1]},
		Groups:  p.Groups,
	})
	if err != nil {
		return nil, err
	}
	defer y5.Free()
	return y5.Reshape(y5.Dim(0), y5.Dim(1), y5.Dim(3), y5.Dim(4))
}

// run tries the tiers in order for one conv.
func (c *convChain) run(key string, p Conv3dParams, hs []C.fpk_tensor_t, out *Tensor) error {
	rt := c.rt
	c.count(func(s *ConvStats) { s.Convs++ })
	entry := c.lookup(key)
	cp := p.c()
	var tierErrs []string
	var oom error
	first := rt.opts.ConvPolicy.firstTier(key)
	for t := Tier(0); t < NumTiers; t++ {
		name := t.String()
		switch {
		case t < first, rt.opts.ConvPolicy.Only && t > first:
			c.count(func(s *ConvStats) { s.Tiers[t].SkippedPolicy++ })
			continue
		case entry.IsHung(name):
			c.count(func(s *ConvStats) { s.Tiers[t].SkippedHung++ })
			tierErrs = append(tierErrs, name+": skipped, hung before")
			continue
		}
		if reason, failed := entry.FailedAt(name); failed && !rt.opts.ConvPolicy.RetryFailed {
			c.count(func(s *ConvStats) { s.Tiers[t].SkippedFailed++ })
			tierErrs = append(tierErrs, name+": skipped, failed before: "+reason)
			continue
		}
		fault, faulted := c.fault(key, t)
		if !faulted && c.tiers&(1<<uint(t)) == 0 {
			c.count(func(s *ConvStats) { s.Tiers[t].Unavailable++ })
			continue
		}
		c.count(func(s *ConvStats) { s.Tiers[t].Attempts++ })
		start := time.Now()
		err := c.attempt(key, t, fault, faulted, &cp, hs, out)
		elapsed := time.Since(start)
		c.count(func(s *ConvStats) { s.Tiers[t].Time += elapsed })
		switch {
		case errors.As(err, new(*OpFaultError)):
			// a test fault fails this conv here: no fall-through, nothing recorded for the shape
			c.count(func(s *ConvStats) { s.Tiers[t].Failures++; s.Failed++ })
			return fmt.Errorf("conv [%s]: %w", key, err)
		case err == nil:
			c.count(func(s *ConvStats) {
				s.Tiers[t].Successes++
				s.Served++
				s.Decisions[key] = t
				sh := s.Shapes[key]
				if sh.Tier != t || sh.Calls == 0 {
					sh = ShapeStats{Tier: t, First: c.first[key+"\x00"+t.String()]}
				}
				sh.Calls++
				sh.Time += elapsed
				s.Shapes[key] = sh
			})
			c.recordServed(key, t, entry)
			return nil
		case errors.Is(err, ErrUnavailable):
			c.count(func(s *ConvStats) { s.Tiers[t].Attempts--; s.Tiers[t].Unavailable++ })
			continue
		case errors.Is(err, ErrOutOfMemory):
			// not recorded: memory pressure is this run's, not the shape's
			c.count(func(s *ConvStats) { s.Tiers[t].Failures++ })
			oom = err
			tierErrs = append(tierErrs, name+": "+err.Error())
			continue
		case errors.Is(err, ErrInvalidArgument):
			// the arguments are wrong for every tier
			c.count(func(s *ConvStats) { s.Tiers[t].Failures++; s.Failed++ })
			return err
		default:
			c.count(func(s *ConvStats) { s.Tiers[t].Failures++ })
			c.recordFailed(key, t, err.Error())
			tierErrs = append(tierErrs, name+": "+err.Error())
		}
	}
	c.count(func(s *ConvStats) { s.Failed++ })
	if oom != nil {
		return fmt.Errorf("conv [%s]: %w", key, oom)
	}
	return fmt.Errorf("conv [%s]: %w (%s)", key, ErrNoConvTier, strings.Join(tierErrs, "; "))
}

// attempt runs one tier once, bracketed by op events.
func (c *convChain) attempt(key string, t Tier, fault ConvFault, faulted bool, cp *C.fpk_conv3d_params,
	hs []C.fpk_tensor_t, out *Tensor) error {
	rt := c.rt
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	if rt.closed {
		return fmt.Errorf("conv3d: %w", ErrClosed)
	}
	// The first run of a tier for a shape is synchronised: the work queued before it finishes
	// first, outside its bracket, and the conv itself is waited for inside it. A GPU hang in it
	// then shows in the beacon as this shape at this tier (not as whichever op came next), so
	// the watchdog marks the right entry of the decision cache. Later runs stay asynchronous.
	first := c.firstRun(key, t)
	if first {
		if err := call("conv3d synchronize", func() C.fpk_status { return C.fpk_stream_synchronize(rt.stream) }); err != nil {
			return err
		}
	}
	native := func(tier Tier) error {
		start := time.Now()
		err := call("conv3d", func() C.fpk_status {
			return C.fpk_op_conv3d(rt.stream, C.fpk_conv_tier(tier), cp, hs[0], hs[1], hs[2], out.h)
		})
		if err != nil || !first {
			return err
		}
		c.count(func(s *ConvStats) { s.Tiers[t].FirstSyncs++ })
		err = call("conv3d", func() C.fpk_status { return C.fpk_stream_synchronize(rt.stream) })
		if err == nil {
			el := time.Since(start)
			c.count(func(*ConvStats) { c.first[key+"\x00"+t.String()] = el })
		}
		return err
	}
	return rt.observe("conv3d", key, t, out, func() error {
		if !faulted {
			return native(t)
		}
		switch fault.Mode {
		case FaultFail:
			return &Error{Op: "conv3d", Status: StatusBackend, Msg: "injected failure at tier " + t.String()}
		case FaultHang:
			if fault.Release == nil {
				for {
					time.Sleep(time.Hour) // a hang the watchdog must kill
				}
			}
			<-fault.Release
			return &Error{Op: "conv3d", Status: StatusBackend, Msg: "injected hang at tier " + t.String() + " released"}
		default: // FaultServe
			return native(TierCPU)
		}
	})
}
