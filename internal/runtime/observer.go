package runtime

import "time"

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
