package pipeline

import (
	"context"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// The glue between the section loop and the lane's watchdog (supervisor/watchdog, owned with
// it): every worker stage runs as watchdog attempts — the worker attached to the watchdog as
// soon as it exists, the attempt's load settings and VAE tiling applied — and a failed attempt
// is classified, recovered from and retried down the degradation ladder, or the job fails with
// every attempt in its story.

// smallStageUnits is the size (megavoxel-steps) up to which a stage may fall back to the CPU.
const smallStageUnits = 1.0

// runOnLane runs one worker stage on the job's lane: once, or under the lane's watchdog.
func (j *jobRun) runOnLane(ctx context.Context, stage framepackv1.Stage, section int, st lanes.Stage) (lanes.Report, error) {
	if j.wd == nil {
		return j.lane.Run(ctx, st)
	}
	info := watchdog.StageInfo{Kind: stage, Model: string(st.Model), Section: uint32(max(section, 0)), Size: j.stageSize(stage)}
	info.Small = stage != framepackv1.Stage_STAGE_TRANSFORMER && info.Size.Units() <= smallStageUnits
	var rep lanes.Report
	err := j.wd.Run(ctx, info, func(ctx context.Context, a *watchdog.Attempt) error {
		att := st
		att.Attach = func(p lanes.Proc) func() {
			if t, ok := p.(watchdog.Target); ok {
				return a.Attach(t)
			}
			return func() {}
		}
		att.PrepareLoad = a.ApplyLoad
		att.Request = withTiling(st.Request, a.Knobs)
		var err error
		rep, err = j.lane.Run(ctx, att)
		a.Kept = err == nil && rep.Kept
		a.ResidentBlocks, a.StreamedBlocks = rep.ResidentBlocks, rep.StreamedBlocks
		return err
	})
	return rep, err
}

// stageSize is a stage's size for its deadline (zero before the frame size is known).
func (j *jobRun) stageSize(stage framepackv1.Stage) watchdog.Size {
	if j.cond == nil {
		return watchdog.Size{}
	}
	h, w := j.cond.height, j.cond.width
	switch stage {
	case framepackv1.Stage_STAGE_TRANSFORMER:
		return watchdog.Size{Frames: plan.Frames(j.window), Height: h, Width: w, Steps: j.steps}
	case framepackv1.Stage_STAGE_VAE_DECODE:
		return watchdog.Size{Frames: 2 * plan.Frames(j.window), Height: h, Width: w}
	case framepackv1.Stage_STAGE_VAE_ENCODE:
		return watchdog.Size{Frames: 1, Height: h, Width: w}
	}
	return watchdog.Size{}
}

// withTiling returns a VAE request with the attempt's tile size (the request itself otherwise).
func withTiling(req workerkit.Stage, k watchdog.Knobs) workerkit.Stage {
	switch r := req.(type) {
	case *workerkit.VAEEncodeRequest:
		c := *r
		c.Tiling = k.VAETiling(r.Tiling)
		return &c
	case *workerkit.VAEDecodeRequest:
		c := *r
		c.Tiling = k.VAETiling(r.Tiling)
		return &c
	}
	return req
}
