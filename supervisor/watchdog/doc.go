// Package watchdog guards the model stages of a lane (ARCHITECTURE.md §6): it detects what went
// wrong with a worker, acts on it, and decides how the stage is tried again.
//
// Detect. Watch reads a worker's beacon page (never a gRPC ping: a worker whose compute thread
// is stuck in a driver call still answers pings) and the process's exit: the op in progress past
// its deadline (the op's own, or Limits.Op), no beacon progress between ops (Limits.Stall), the
// stage past its deadline (Limits.Stage, estimated from the stage's size by Deadlines), or the
// process gone. The worker's own typed errors (out of memory, device lost, invalid argument)
// arrive with the failed call. Classify turns error and verdict into a Class: ok, oom, hang,
// crash, device-lost, bad-input (or cancelled, which is not a failure).
//
// Act. A Guard attached to the worker SIGKILLs its process group and reaps it on a hang. After
// every worker exit the Recovery check waits (250 ms polls, up to 5 s) for the process group to
// be gone and the driver's used-memory figure to come back to the pre-spawn baseline (NVML by
// PCI bus id or amdgpu sysfs, or the fake ledger of tests); when it does not, the lane is held (Health)
// and a monitor releases it when the memory returns. After a crash or a lost device,
// RecoverDevice runs the probe worker with a timeout; while probes fail the lane is degraded
// and backs off (2 s doubling to 5 min).
//
// Retry. Job.Run runs a stage's attempts: bad input is never retried; otherwise the Ladder says
// what the next attempt changes (a hang: mark the hung conv shape and tier in the decision cache
// so the next worker skips it; out of memory: for a model with a stack of blocks (the
// transformer's blocks, the text encoder's Llama layers) half the blocks the failed attempt
// reported resident, down to 1, then a lower memory cap, then tiles 256 → 128 → 64 px for a
// model that tiles, then a narrower activation dtype the model declared, then convolutions one
// tier further down for a model that convolves; finally CPU for small stages), within a
// per-stage and per-job Budget. What a model has is what its worker declared
// (workerkit.ModelTraits, in its LoadResponse), never the stage's name. When it runs out, the job fails with a GiveUpError that
// carries every attempt, its class and what was changed; the service stays up.
//
// The watchdog returns decisions and edits no worker request: an Attempt's Override (backend,
// memory cap, resident blocks, activation dtype, conv tier, tile, decision cache, test fault;
// one type, workerkit.Override) is what the pipeline hands the lane, which applies it to the
// worker's LoadRequest and the stage's request; the AttemptFunc hands back the residency and the
// traits the worker reported (Attempt.ResidentBlocks, StreamedBlocks, Traits). The lane calls Attempt.Attach as soon as a worker
// process exists. Retries are reported as Retry values; the pipeline makes the job's public
// events of them. Fault injection for tests comes in through Config.FaultPlan only (see package
// internal/faults for why nothing else can reach it). Notifier speaks sd_notify to systemd
// (READY, WATCHDOG) from the daemon's main loop.
package watchdog
