package runtime

import (
	"fmt"
	"sync/atomic"
	"time"
)

// OpPhase says whether an OpEvent marks the start or the end of an op.
type OpPhase int

// Op phases.
const (
	OpBegin OpPhase = iota
	OpEnd
)

// OpEvent describes one runtime op as it starts or ends. Conv ops report one begin/end pair per
// tier attempt, with Key and Tier set, so a worker's beacon shows which conv shape and tier it
// is in if the call never returns.
type OpEvent struct {
	Seq   uint64    // increases by one per op begin, over the runtime's life
	Phase OpPhase   // OpBegin or OpEnd
	Op    string    // "conv3d", "attention", "gemm", ...
	Key   string    // conv shape key (conv ops only)
	Tier  Tier      // conv tier (conv ops only)
	Start time.Time // when the op (or tier attempt) began
	Err   error     // OpEnd: the op's error, if any
	// Bytes is what the allocator held when the event was made (tensors and scratch, as
	// MemoryStats.Allocated): at OpBegin with the op's output already allocated, at OpEnd
	// after its scratch is given back. Set when an observer or fault hook is installed.
	Bytes uint64
	// Cap is the memory cap at that moment (0: none).
	Cap uint64
	// OutBytes is the size of the op's output tensor (0 for ops without one, like fill).
	OutBytes uint64
}

// OpObserver is called synchronously at the start and end of every op (before the native call
// and after it returns). It must be fast and must not call back into the runtime; the worker
// uses it to publish its beacon (op sequence, op name, start time).
type OpObserver func(OpEvent)

// CurrentOp is the op a runtime is in, for a beacon polled instead of observed.
type CurrentOp struct {
	Seq   uint64
	Op    string
	Key   string
	Tier  Tier
	Start time.Time
}

// OpFaultError is an op failed by Options.OpFault (a test fault) before it ran. It wraps the
// hook's error, so errors.Is and errors.As see through it (an injected *OOMError is
// errors.Is(err, ErrOutOfMemory)). The conv chain neither falls through to the next tier on it
// nor records it in the decision cache.
type OpFaultError struct {
	Op  string // the op that failed
	Seq uint64 // its sequence number (OpEvent.Seq)
	Err error  // the hook's error
}

// Error implements error: the hook's message.
func (e *OpFaultError) Error() string { return e.Err.Error() }

// Unwrap returns the hook's error.
func (e *OpFaultError) Unwrap() error { return e.Err }

// InjectedOOMBytes is the request an injected out of memory reports for an op without an
// output of its own.
const InjectedOOMBytes = 1 << 30

// OOMAtOp returns an Options.OpFault hook that fails one op with an *OOMError: with name "",
// the op numbered n (OpEvent.Seq, from 1); else the n-th op named name (each conv tier attempt
// counts as one conv3d). The error asks for the op's output bytes (InjectedOOMBytes when it has
// none) with what the cap leaves as available, as a real failed allocation of the op would.
func OOMAtOp(name string, n uint64) func(OpEvent) error {
	var calls atomic.Uint64
	return func(e OpEvent) error {
		hit := (name == "" && e.Seq == n) || (name != "" && e.Op == name && calls.Add(1) == n)
		if !hit {
			return nil
		}
		req := e.OutBytes
		if req == 0 {
			req = InjectedOOMBytes
		}
		var avail uint64
		if e.Cap > e.Bytes {
			avail = e.Cap - e.Bytes
		}
		return &OOMError{Op: e.Op, Requested: req, Available: avail,
			Msg: fmt.Sprintf("injected at op %d (%s)", e.Seq, e.Op)}
	}
}
