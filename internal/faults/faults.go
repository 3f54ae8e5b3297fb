// Package faults injects failures into worker processes, for the supervisor's fault tests: exit
// with a signal at op N, hang at op N (the beacon stops, gRPC keeps answering), a typed
// out-of-memory error at op N, and fake device memory left held after the worker exits. (A hang
// in one conv shape at one tier is the runtime's ConvFault; the worker maps Fault's conv fields
// to it.)
//
// Where faults come from, and why an attacker cannot reach them: a worker honours only
// LoadRequest.Fault, which only the supervisor builds. The public API (framepack.v1 JobService,
// DeviceService) has no field that reaches it, and the supervisor sets it only from a test hook
// (a Go function field of its stage runner, nil in production; no flag, config key or request
// field sets it). A worker binary started by hand with a crafted LoadRequest can already do
// anything its user can, so the worker does not need a second gate. The fake device-memory
// ledger is read only where the supervisor was configured with its directory (tests).
//
// Op numbers are the beacon's op sequence numbers (the first op of the process is 1), the
// numbers the watchdog sees.
package faults

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/envconfig"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// InjectedOOMBytes is the request size an injected out-of-memory error reports.
const InjectedOOMBytes = 1 << 30

// Caps says which faults a worker can honour beyond the op-numbered ones every worker has.
type Caps struct {
	// Conv: the worker runs convolutions through the runtime's chain and maps the hang_conv
	// fields to a runtime.ConvFault.
	Conv bool
}

// Injector fires one worker process's faults and keeps its beacon current. A worker makes one
// at start (New with a nil fault: beacon only) and replaces it in Load. A nil *Injector is
// valid and does nothing (BeginOp returns the runtime's op number).
type Injector struct {
	f   workerkit.Fault
	log *logrus.Entry
	bw  *beacon.Writer

	oomAt atomic.Uint64 // op number at which the injected OOM fired (0: not yet)
	oomOp atomic.Pointer[string]
	oomRT atomic.Uint64                   // the runtime's number of that op (OpErr matches it)
	oomE  atomic.Pointer[workerkit.Error] // the error OpErr failed the op with

	// exit and hang are what an op-numbered fault does; tests of this package replace them.
	exit func(sig syscall.Signal)
	hang func()
}

// ErrInvalid marks a fault the worker cannot honour; workers report it as invalid argument.
var ErrInvalid = errors.New("invalid fault")

// New checks f against what the worker can do and returns its injector; f nil means no faults
// (the injector then only keeps the beacon). When f holds fake device memory it is recorded in
// the ledger at once (see HoldFakeVRAM), so it counts from Load on.
func New(f *workerkit.Fault, caps Caps, bw *beacon.Writer, log *logrus.Entry) (*Injector, error) {
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	in := &Injector{bw: bw, log: log, exit: raise, hang: hangForever}
	if f == nil {
		return in, nil
	}
	in.f = *f
	if f.ExitSignal < 0 || f.ExitSignal > 64 {
		return nil, fmt.Errorf("%w: exit_signal %d", ErrInvalid, f.ExitSignal)
	}
	if f.HangConvTier != workerkit.ConvTierUnspecified {
		if !caps.Conv {
			return nil, fmt.Errorf("%w: hang_conv_tier: this worker runs no convolutions", ErrInvalid)
		}
		if f.HangConvTier < workerkit.ConvTierVendorTuned || f.HangConvTier > workerkit.ConvTierCPU {
			return nil, fmt.Errorf("%w: hang_conv_tier %d", ErrInvalid, f.HangConvTier)
		}
	}
	if f.HoldVRAMBytes != 0 {
		dir := envconfig.FakeVRAMDir.Get()
		if dir == "" {
			return nil, fmt.Errorf("%w: hold_vram_bytes needs the fake device ledger (%s unset)", ErrInvalid, EnvFakeVRAMDir)
		}
		hold := time.Duration(f.HoldVRAMSeconds) * time.Second
		if err := HoldFakeVRAM(dir, os.Getpid(), f.HoldVRAMBytes, hold); err != nil {
			return nil, fmt.Errorf("fault: %w", err)
		}
		log.WithFields(logrus.Fields{"bytes": f.HoldVRAMBytes, "hold_after_exit": hold}).Warn("fault: holding fake device memory")
	}
	return in, nil
}

// Fault returns the fault the injector fires (zero when none).
func (in *Injector) Fault() workerkit.Fault {
	if in == nil {
		return workerkit.Fault{}
	}
	return in.f
}

// BeginOp records the start of an op on the beacon (with its conv shape key and tier, for a
// conv tier attempt) and fires the fault set for this op number, if any: the process kills
// itself with the exit signal, or the calling thread blocks forever (a hang: the beacon stays
// on this op while gRPC keeps answering), or the injected out-of-memory error is armed (Err).
// runtimeSeq is the runtime's own op count, used as the op number when there is no beacon.
// It returns the op number.
func (in *Injector) BeginOp(op, convKey, convTier string, runtimeSeq uint64) uint64 {
	if in == nil {
		return runtimeSeq
	}
	seq := in.bw.BeginConvOp(op, convKey, convTier, 0)
	if seq == 0 {
		seq = runtimeSeq
	}
	f := &in.f
	switch {
	case f.ExitAtOp != 0 && seq == f.ExitAtOp:
		sig := syscall.Signal(f.ExitSignal)
		if sig == 0 {
			sig = syscall.SIGKILL
		}
		in.log.WithFields(logrus.Fields{"op": op, "seq": seq, "signal": sig}).Warn("fault: exiting at op")
		in.exit(sig)
	case f.HangAtOp != 0 && seq == f.HangAtOp:
		in.log.WithFields(logrus.Fields{"op": op, "seq": seq}).Warn("fault: hanging at op")
		in.hang()
	case f.OOMAtOp != 0 && seq == f.OOMAtOp:
		in.log.WithFields(logrus.Fields{"op": op, "seq": seq}).Warn("fault: out of memory at op")
		in.oomOp.Store(&op)
		in.oomRT.Store(runtimeSeq)
		in.oomAt.Store(seq)
	}
	return seq
}

// EndOp records the end of the current op on the beacon.
func (in *Injector) EndOp() {
	if in != nil {
		in.bw.EndOp()
	}
}

// OpErr fails the oom_at_op op itself: for the runtime op numbered runtimeSeq, when BeginOp
// armed the injected out of memory at it, it returns that error (once), asking for outBytes
// (the op's output; InjectedOOMBytes when 0) with what cap leaves beside held bytes as
// available; nil otherwise. A worker returns it from the runtime's Options.OpFault hook (the
// runtime calls the observer, hence BeginOp, first), so the op fails with a typed out of memory
// before it runs, as a real failed allocation would.
func (in *Injector) OpErr(runtimeSeq, outBytes, held, cap uint64) error {
	if in == nil || in.oomAt.Load() == 0 || in.oomRT.Load() != runtimeSeq || in.oomE.Load() != nil {
		return nil
	}
	req := outBytes
	if req == 0 {
		req = InjectedOOMBytes
	}
	var avail uint64
	if cap > held {
		avail = cap - held
	}
	op := ""
	if p := in.oomOp.Load(); p != nil {
		op = *p
	}
	e := &workerkit.Error{Code: workerkit.CodeOutOfMemory, RequestedBytes: req, AvailableBytes: avail,
		Message: fmt.Sprintf("op %d (%s): out of memory: requested %d bytes, %d available (injected by fault oom_at_op)", in.oomAt.Load(), op, req, avail)}
	if !in.oomE.CompareAndSwap(nil, e) {
		return nil
	}
	return e
}

// Err returns the injected out-of-memory error once its op has started, nil before (and
// always nil without an oom_at_op fault): the error OpErr failed the op with, when the worker
// routes the runtime's OpFault hook to OpErr. A worker also checks it where its stage can fail
// (step or tile callbacks, before writing outputs), for an op number that is no runtime op.
func (in *Injector) Err() error {
	if in == nil {
		return nil
	}
	seq := in.oomAt.Load()
	if seq == 0 {
		return nil
	}
	if e := in.oomE.Load(); e != nil {
		return e
	}
	op := ""
	if p := in.oomOp.Load(); p != nil {
		op = *p
	}
	return &workerkit.Error{Code: workerkit.CodeOutOfMemory, RequestedBytes: InjectedOOMBytes,
		Message: fmt.Sprintf("op %d (%s): out of memory: requested %d bytes, 0 available (injected by fault oom_at_op)", seq, op, InjectedOOMBytes)}
}

// raise sends sig to the process and waits for it to end the process.
func raise(sig syscall.Signal) {
	_ = syscall.Kill(os.Getpid(), sig)
	if sig != syscall.SIGKILL {
		// A signal the runtime turns into a panic or that is ignored must still end the
		// process, as an injected crash promises.
		time.Sleep(time.Second)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	select {}
}

// hangForever blocks the calling goroutine for good.
func hangForever() { select {} }
