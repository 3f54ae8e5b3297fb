package main

// Operations flags: the watchdog's hang deadlines, retry budget and VRAM-recovery wait.

import (
	"flag"
	"fmt"
	"time"

	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// opsOptions are the watchdog's tunables as flags; their defaults are the watchdog's.
type opsOptions struct {
	deadlineScale  float64
	opDeadline     time.Duration
	stall          time.Duration
	retriesStage   int
	retriesJob     int
	recoveryWait   time.Duration
	recoveryMargin uint64
}

// addOpsFlags registers the operations flags on fs.
func addOpsFlags(fs *flag.FlagSet) *opsOptions {
	d := watchdog.DefaultDeadlines()
	o := &opsOptions{}
	fs.Float64Var(&o.deadlineScale, "hang-deadline-scale", 1, "multiply every stage's and op's hang deadline (stage deadlines start at 10-30 min plus a per-size part; a slow CPU lane may want 20)")
	fs.DurationVar(&o.opDeadline, "op-deadline", d.OpMin, "shortest deadline of one op (a conv, a gemm) before the worker is judged hung and killed")
	fs.DurationVar(&o.stall, "stall-timeout", d.Stall, "kill a worker whose beacon shows no progress at all for this long")
	fs.IntVar(&o.retriesStage, "retries-per-stage", watchdog.DefaultBudget.PerStage, "most attempts of one stage (the first included) before the job fails")
	fs.IntVar(&o.retriesJob, "retries-per-job", watchdog.DefaultBudget.PerJob, "most failed attempts over a whole job before it fails")
	fs.DurationVar(&o.recoveryWait, "vram-recovery-wait", watchdog.DefaultRecoveryTimeout, "after a worker exits, how long to wait for the device's memory to come back before holding the lane")
	return o
}

// check refuses values the watchdog cannot use.
func (o *opsOptions) check() error {
	switch {
	case !(o.deadlineScale > 0):
		return fmt.Errorf("--hang-deadline-scale must be more than 0, got %g", o.deadlineScale)
	case o.opDeadline <= 0 || o.stall <= 0:
		return fmt.Errorf("--op-deadline and --stall-timeout must be more than 0")
	case o.retriesStage < 1 || o.retriesJob < 1:
		return fmt.Errorf("--retries-per-stage and --retries-per-job must be at least 1")
	case o.recoveryWait <= 0:
		return fmt.Errorf("--vram-recovery-wait must be more than 0")
	}
	return nil
}

// apply sets the flags' values in a lane's watchdog configuration.
func (o *opsOptions) apply(c *watchdog.Config) {
	d := watchdog.DefaultDeadlines()
	d.Scale, d.OpMin, d.Stall = o.deadlineScale, o.opDeadline, o.stall
	c.Deadlines = d
	c.Budget = watchdog.Budget{PerStage: o.retriesStage, PerJob: o.retriesJob}
	if c.Recovery == nil {
		c.Recovery = &watchdog.Recovery{}
	}
	c.Recovery.Timeout = o.recoveryWait
}
