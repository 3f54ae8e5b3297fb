package pipeline

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"

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
	info := watchdog.StageInfo{Kind: stage, Model: string(st.Model), Section: uint32(max(section, 0)), Size: j.stageSize(stage),
		MemoryCap: st.MemoryCap}
	info.Small = stage != framepackv1.Stage_STAGE_TRANSFORMER && info.Size.Units() <= smallStageUnits
	var rep lanes.Report
	err := j.wd.Run(ctx, info, func(ctx context.Context, a *watchdog.Attempt) error {
		j.attempt = a.Number
		if a.Number > 1 {
			j.stageAttemptStarted(stage, section, a.Number) // a retry: its own StageStarted
		}
		att := st
		if a.Number > 1 {
			// A retry runs with the whole budget: the estimate (or the plan's share) may be what
			// ran short, and the ladder's rungs (fewer resident blocks, smaller tiles, a lower
			// cap) then work from the budget.
			att.Need, att.Cap = nil, 0
		}
		att.Attach = func(p lanes.Proc) func() {
			if t, ok := p.(watchdog.Target); ok {
				return a.Attach(t)
			}
			return func() {}
		}
		d := a.Decision()
		att.Load = lanes.LoadSettings{Backend: d.Backend, MemoryCap: d.MemoryCap, MaxResidentBlocks: d.MaxResidentBlocks,
			ConvFirstTier: d.ConvFirstTier, ConvCachePath: d.ConvCachePath, Fault: d.Fault}
		att.Request = withTiling(st.Request, d.VAETilePx)
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

// withTiling returns a VAE request with spatial tiles of px pixels and diffusers' 3/4 stride
// (the request itself when px is 0 or the stage is not the VAE's).
func withTiling(req workerkit.Stage, px uint32) workerkit.Stage {
	if px == 0 {
		return req
	}
	tiled := func(base *workerkit.VAETiling) *workerkit.VAETiling {
		t := workerkit.VAETiling{}
		if base != nil {
			t = *base
		}
		t.EnableSpatialTiling = true
		t.TileSampleMinHeight, t.TileSampleMinWidth = px, px
		t.TileSampleStrideHeight, t.TileSampleStrideWidth = px*3/4, px*3/4
		return &t
	}
	switch r := req.(type) {
	case *workerkit.VAEEncodeRequest:
		c := *r
		c.Tiling = tiled(r.Tiling)
		return &c
	case *workerkit.VAEDecodeRequest:
		c := *r
		c.Tiling = tiled(r.Tiling)
		return &c
	}
	return req
}

// retryEvent is the job's public Retry event for a watchdog retry.
func retryEvent(jobID string, r watchdog.Retry) *framepackv1.JobEvent {
	return &framepackv1.JobEvent{JobId: jobID, Event: &framepackv1.JobEvent_Retry{Retry: &framepackv1.RetryEvent{
		Attempt: r.Attempt, Delay: durationpb.New(r.Delay)}}}
}
