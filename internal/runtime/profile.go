package runtime

// #include "fpk.h"
import "C"

import (
	"errors"
	"fmt"
	"time"
)

// OpTime is one op's time under Profile: from the op's start until its device work finished
// (the stream is synchronised after every op, so the time holds the host's launch cost and the
// device's work of this op alone).
type OpTime struct {
	Op    string // "linear", "attention", "conv3d", ...
	Tier  Tier   // conv3d: the tier attempt
	DType DType  // the output's dtype (AsStored for ops without an output, like fill)
	// Shape is the output's shape (nil without an output); the callee must not keep or modify it.
	Shape    []int
	Duration time.Duration
	Err      error // the op's error, if any
}

// ErrProfiling is returned by Profile when another Profile call is running on the runtime.
var ErrProfiling = errors.New("runtime: a profile is already running")

// Profile runs fn with the runtime's stream synchronised after every op and calls each with
// every op's time, in order, on the goroutine that ran the op. It serialises host and device and
// so perturbs the timing it reports: the sum is more than fn's unprofiled time (the launch
// overlap is gone). Use it to see where the time goes, never in timed runs. each must be fast
// and must not call back into the runtime.
func (rt *Runtime) Profile(fn func() error, each func(OpTime)) error {
	if err := rt.Synchronize(); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	if !rt.prof.CompareAndSwap(nil, &each) {
		return ErrProfiling
	}
	defer rt.prof.Store(nil)
	return fn()
}

// profiled synchronises the stream after an op and reports its time (caller holds rt.mu read,
// the runtime is open).
func (rt *Runtime) profiled(each func(OpTime), op string, tier Tier, out *Tensor, start time.Time, err error) {
	serr := call(op+" (profile sync)", func() C.fpk_status { return C.fpk_stream_synchronize(rt.stream) })
	t := OpTime{Op: op, Tier: tier, DType: AsStored, Duration: time.Since(start), Err: err}
	if t.Err == nil {
		t.Err = serr
	}
	if out != nil {
		t.DType, t.Shape = out.dtype, out.shape
	}
	each(t)
}
