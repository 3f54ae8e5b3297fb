package watchdog

import (
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// Size is how big a stage is, for its deadline: the pixel volume it produces or consumes and
// its sampling steps.
type Size struct {
	Frames, Height, Width int
	// Steps is the number of sampling steps (transformer); 0 counts as 1.
	Steps int
}

// Units returns the stage's work in megavoxel-steps (frames × height × width / 1e6 × steps).
func (s Size) Units() float64 {
	vox := float64(max(s.Frames, 1)) * float64(max(s.Height, 0)) * float64(max(s.Width, 0)) / 1e6
	return vox * float64(max(s.Steps, 1))
}

// Cost turns a stage's size into its deadline: Base + PerUnit × Units, at most Max (0: no cap).
type Cost struct {
	Base    time.Duration
	PerUnit time.Duration
	Max     time.Duration
}

// Deadlines configure the limits of every stage kind. Zero fields of a stage's Cost fall back
// to Default's.
type Deadlines struct {
	// Stages holds the cost of each stage kind.
	Stages map[framepackv1.Stage]Cost
	// Default is the cost of a stage kind missing from Stages.
	Default Cost
	// OpFraction sets an op's default deadline as a fraction of its stage's deadline, at
	// least OpMin: one op should not take most of a stage.
	OpFraction float64
	OpMin      time.Duration
	// Stall is Limits.Stall for every stage.
	Stall time.Duration
	// Scale multiplies every deadline (a slow CPU lane: 20; tests: small); 0 means 1.
	Scale float64
	// Poll is Limits.Poll.
	Poll time.Duration
}

// DefaultDeadlines are generous: they catch a worker stuck for good without cutting short a
// slow but progressing stage (a cold MIOpen Find, a CPU lane). Operators tune them per lane.
func DefaultDeadlines() Deadlines {
	return Deadlines{
		Stages: map[framepackv1.Stage]Cost{
			framepackv1.Stage_STAGE_TEXT_ENCODE:  {Base: 20 * time.Minute},
			framepackv1.Stage_STAGE_VAE_ENCODE:   {Base: 10 * time.Minute, PerUnit: time.Minute},
			framepackv1.Stage_STAGE_IMAGE_ENCODE: {Base: 10 * time.Minute},
			framepackv1.Stage_STAGE_TRANSFORMER:  {Base: 20 * time.Minute, PerUnit: 30 * time.Second},
			framepackv1.Stage_STAGE_VAE_DECODE:   {Base: 10 * time.Minute, PerUnit: time.Minute},
		},
		Default:    Cost{Base: 30 * time.Minute},
		OpFraction: 0.25,
		OpMin:      5 * time.Minute,
		Stall:      10 * time.Minute,
	}
}

// Limits returns the limits of one attempt of stage at size sz.
func (d Deadlines) Limits(stage framepackv1.Stage, sz Size) Limits {
	c, ok := d.Stages[stage]
	if !ok {
		c = d.Default
	}
	if c.Base == 0 {
		c.Base = d.Default.Base
	}
	if c.PerUnit == 0 {
		c.PerUnit = d.Default.PerUnit
	}
	if c.Max == 0 {
		c.Max = d.Default.Max
	}
	scale := d.Scale
	if scale <= 0 {
		scale = 1
	}
	stageLim := c.Base + time.Duration(float64(c.PerUnit)*sz.Units())
	if c.Max > 0 && stageLim > c.Max {
		stageLim = c.Max
	}
	stageLim = time.Duration(float64(stageLim) * scale)
	op := max(time.Duration(float64(stageLim)*d.OpFraction), time.Duration(float64(d.OpMin)*scale))
	if d.OpFraction <= 0 && d.OpMin <= 0 {
		op = 0
	}
	return Limits{Stage: stageLim, Op: op, Stall: time.Duration(float64(d.Stall) * scale), Poll: d.Poll}
}
