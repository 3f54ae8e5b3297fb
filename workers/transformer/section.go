package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/torchrng"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
	"github.com/framepackd/framepackd/workers/transformer/dit"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// maxSteps is the most sampling steps a request may ask for (worker.proto).
const maxSteps = 100

// sectionPlan is a validated TransformerSectionRequest: the sampler request without its noise,
// and the generator the noise comes from.
type sectionPlan struct {
	req       sampler.Request
	magcache  dit.MagCacheSettings
	gen       *torchrng.Generator
	pos, neg  *conditioning.Conditioning
	previews  []workerkit.TensorRef
	latentRef workerkit.TensorRef
}

func finite(name string, v float32) error {
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		return workerkit.InvalidArgumentf("%s is %v", name, v)
	}
	return nil
}

// plan checks the request's settings and reads its input tensors.
func (w *worker) plan(req *workerkit.TransformerSectionRequest) (*sectionPlan, error) {
	switch {
	case req.Steps < 1 || req.Steps > maxSteps:
		return nil, workerkit.InvalidArgumentf("steps %d (1 to %d)", req.Steps, maxSteps)
	case req.Width == 0 || req.Height == 0 || req.Width%16 != 0 || req.Height%16 != 0:
		return nil, workerkit.InvalidArgumentf("size %d×%d: width and height must be positive multiples of 16", req.Width, req.Height)
	case req.Frames == 0 || req.Frames > 4096:
		return nil, workerkit.InvalidArgumentf("frames %d", req.Frames)
	}
	for name, v := range map[string]float32{"cfg": req.CFG, "gs": req.GS, "rs": req.RS, "teacache_threshold": req.TeaCacheThreshold} {
		if err := finite(name, v); err != nil {
			return nil, err
		}
	}
	if req.RS < 0 || req.RS > 1 {
		return nil, workerkit.InvalidArgumentf("rs %v (0 to 1)", req.RS)
	}
	if req.TeaCacheThreshold < 0 {
		return nil, workerkit.InvalidArgumentf("teacache_threshold %v", req.TeaCacheThreshold)
	}
	mag, err := magCacheSettings(req)
	if err != nil {
		return nil, err
	}
	opts := sampler.Options{
		Steps:             int(req.Steps),
		Guidance:          sampler.Guidance{Distilled: float64(req.GS), CFG: float64(req.CFG), Rescale: float64(req.RS)},
		DType:             w.dtype,
		TeaCache:          req.UseTeaCache,
		TeaCacheThreshold: float64(req.TeaCacheThreshold),
		MagCache:          req.MagCache != nil,
	}
	if req.Shift != nil {
		if err := finite("shift", *req.Shift); err != nil || *req.Shift <= 0 {
			return nil, workerkit.InvalidArgumentf("shift %v must be positive", *req.Shift)
		}
		opts.Shift = float64(*req.Shift)
	}
	switch req.Sampler {
	case workerkit.SamplerUnspecified, workerkit.SamplerUniPCBH1:
		opts.Variant = sampler.BH1
	case workerkit.SamplerUniPCBH2:
		opts.Variant = sampler.BH2
	default:
		return nil, workerkit.InvalidArgumentf("sampler %d", req.Sampler)
	}
	shape := sampler.LatentShape(1, int(req.Width), int(req.Height), int(req.Frames))

	if err := tensorio.CheckFloatOutput("latents", req.Latents); err != nil {
		return nil, err
	}
	if err := tensorio.CheckShape("latents", req.Latents, tensorio.Shape64(shape.Ints())); err != nil {
		return nil, err
	}
	if n := len(req.StepPreviews); n != 0 && n != int(req.Steps) {
		return nil, workerkit.InvalidArgumentf("step_previews has %d entries, want 0 or steps (%d)", n, req.Steps)
	}
	for i, r := range req.StepPreviews {
		field := fmt.Sprintf("step_previews[%d]", i)
		if err := tensorio.CheckFloatOutput(field, r); err != nil {
			return nil, err
		}
		if err := tensorio.CheckShape(field, r, tensorio.Shape64(shape.Ints())); err != nil {
			return nil, err
		}
	}

	gen := torchrng.New(torchrng.SeedFromInt(req.Seed))
	if len(req.GeneratorState) > 0 {
		if err := gen.UnmarshalBinary(req.GeneratorState); err != nil {
			return nil, workerkit.InvalidArgumentf("generator_state: %v", err)
		}
	}

	var in inputs
	pos := new(conditioning.Conditioning)
	*pos = in.conditioning(req.TransformerConditioning)
	var neg *conditioning.Conditioning
	if req.CFG != 1 {
		n := *pos
		in.text(&n, req.Negative, "_n")
		neg = &n
	}
	if in.err != nil {
		return nil, in.err
	}
	return &sectionPlan{
		req:       sampler.Request{Shape: shape, Positive: pos, Negative: neg, Options: opts},
		magcache:  mag,
		gen:       gen,
		pos:       pos,
		neg:       neg,
		previews:  req.StepPreviews,
		latentRef: req.Latents,
	}, nil
}

// section samples one section: prepare both branches, draw the noise, run UniPC with a
// progress event and a preview per step, write the latents.
func (w *worker) section(ctx context.Context, req *workerkit.TransformerSectionRequest, emit workerkit.Emit, start time.Time, log *logrus.Entry) (*workerkit.Result, error) {
	sp, err := w.plan(req)
	if err != nil {
		return nil, err
	}
	shape := sp.req.Shape
	m := w.model
	send := func(e workerkit.Event) error {
		if emit == nil {
			return ctx.Err()
		}
		if err := emit(e); err != nil {
			return fmt.Errorf("emit: %w", err)
		}
		return nil
	}
	if err := send(&workerkit.Progress{Phase: "prepare", Elapsed: time.Since(start)}); err != nil {
		return nil, err
	}
	sm := newSamplerModel(m)
	sm.magSettings = sp.magcache
	defer sm.Close()
	for _, c := range []*sampler.Conditioning{sp.pos, sp.neg} {
		if c == nil {
			continue
		}
		if _, err := sm.prepare(c, shape); err != nil {
			return nil, err
		}
	}
	noise, err := sp.gen.Randn(shape.Ints())
	if err != nil {
		return nil, fmt.Errorf("noise: %w", err)
	}
	state, err := sp.gen.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("generator state: %w", err)
	}

	calls := 0
	sm.onForward = func(sampler.ForwardInput) { calls++ }
	steps := sp.req.Steps
	req2 := sp.req
	req2.Noise = noise
	req2.OnStep = func(s sampler.StepInfo) error {
		if err := w.base.InjectedOOM(); err != nil {
			return err // injected out of memory (a test fault)
		}
		w.base.Beacon.SetStep(s.Step+1, s.Steps)
		w.base.Beacon.SetBytes(int64(w.rt.Memory().Allocated))
		fields := map[string]string{"step": fmt.Sprint(s.Step + 1), "sigma": fmt.Sprint(s.Sigma)}
		if tc := sm.cacheCalls(); len(tc) > 0 {
			name := "teacache"
			if req.MagCache != nil {
				name = "magcache"
			}
			last := tc[len(tc)-1]
			fields[name] = "computed"
			if !last.Computed {
				fields[name] = "skipped"
			}
			if req.UseTeaCache {
				fields["teacache_accumulated"] = fmt.Sprint(last.Accumulated)
			}
		}
		if err := send(&workerkit.LogLine{Level: workerkit.LogDebug, Message: "step done", Fields: fields}); err != nil {
			return err
		}
		if len(sp.previews) > 0 {
			ref := sp.previews[s.Step]
			written, err := tensorio.WriteFloat(fmt.Sprintf("step_previews[%d]", s.Step), ref, s.Denoised, tensorio.Shape64(shape.Ints()))
			if err != nil {
				return fmt.Errorf("step %d preview: %w", s.Step+1, err)
			}
			if err := send(&workerkit.StepPreview{Step: uint32(s.Step + 1), Denoised: written}); err != nil {
				return err
			}
		}
		return send(&workerkit.Progress{Phase: "sample", Step: uint32(s.Step + 1), TotalSteps: uint32(steps), Elapsed: time.Since(start)})
	}
	out, err := sampler.Sample(ctx, sm, req2)
	if err == nil {
		err = w.base.InjectedOOM() // injected out of memory in the last step (a test fault)
	}
	if err != nil {
		return nil, err
	}
	if err := send(&workerkit.Progress{Phase: "write", Elapsed: time.Since(start)}); err != nil {
		return nil, err
	}
	written, err := tensorio.WriteFloat("latents", sp.latentRef, out, tensorio.Shape64(shape.Ints()))
	if err != nil {
		return nil, fmt.Errorf("latents: %w", err)
	}
	var skipped []uint32
	for i, c := range sm.cacheCalls() {
		if !c.Computed {
			skipped = append(skipped, uint32(i))
		}
	}
	log.WithFields(logrus.Fields{"steps": steps, "transformer_calls": calls, "cache_skipped": sm.cacheSkipped(),
		"skipped_steps": fmt.Sprint(skipped), "shape": fmt.Sprint(shape.Ints())}).Info("section sampled")
	return &workerkit.Result{Outputs: []workerkit.TensorRef{written}, Stats: w.base.Stats(), GeneratorState: state, CacheSkippedSteps: skipped}, nil
}

// magCacheSettings checks a request's MagCache settings and fills in the defaults.
func magCacheSettings(req *workerkit.TransformerSectionRequest) (dit.MagCacheSettings, error) {
	m := req.MagCache
	if m == nil {
		return dit.MagCacheSettings{}, nil
	}
	if req.UseTeaCache {
		return dit.MagCacheSettings{}, workerkit.InvalidArgumentf("magcache and use_teacache are both set; use one")
	}
	s := dit.MagCacheSettings{Threshold: m.Threshold, MaxConsecutiveSkips: int(m.MaxConsecutiveSkips), RetentionRatio: dit.DefaultMagCacheRetentionRatio}
	switch m.Calibration {
	case workerkit.MagCacheFramePack:
		s.Calibration = dit.MagCacheFramePack
	case workerkit.MagCacheFramePackF1:
		s.Calibration = dit.MagCacheFramePackF1
	default:
		return s, workerkit.InvalidArgumentf("magcache.calibration %d: want framepack (1) or framepack_f1 (2)", m.Calibration)
	}
	if m.RetentionRatio != nil {
		s.RetentionRatio = *m.RetentionRatio
	}
	switch {
	case math.IsNaN(s.Threshold) || s.Threshold < 0 || s.Threshold > 1:
		return s, workerkit.InvalidArgumentf("magcache.threshold %v: want (0, 1], 0 for 0.1", s.Threshold)
	case s.MaxConsecutiveSkips > maxSteps:
		return s, workerkit.InvalidArgumentf("magcache.max_consecutive_skips %d: want 1 to %d, 0 for 2", s.MaxConsecutiveSkips, maxSteps)
	case math.IsNaN(s.RetentionRatio) || s.RetentionRatio < 0 || s.RetentionRatio > 1:
		return s, workerkit.InvalidArgumentf("magcache.retention_ratio %v: want 0 to 1", s.RetentionRatio)
	}
	return s, nil
}
