package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/workers/transformer/dit"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// Cache stages: one whole section (FramePack's 25 UniPC steps at the 640 bucket, window 9,
// distilled guidance 10, cfg 1) with no step cache, with TeaCache (threshold 0.15) and with
// MagCache (FramePack-Studio's defaults: threshold 0.1, 2 skips in a row, retention 0.25, the
// i2v transformer's ratios): the speed-ups of issue 33, measured in one run on one device.
var cacheStages = []string{"section_nocache", "section_teacache", "section_magcache"}

const sectionSteps = 25

// cacheModel is the packed transformer as the sampler drives it with one branch (cfg 1), with
// TeaCache or MagCache (the worker's samplerModel, reduced to what the benchmark needs).
type cacheModel struct {
	m       *dit.Model
	sec     *dit.Section
	tea     dit.TeaCache
	mag     dit.MagCache
	magSet  dit.MagCacheSettings
	forward int
}

func (c *cacheModel) Forward(ctx context.Context, in sampler.ForwardInput) ([]float32, error) {
	c.forward++
	return c.m.Forward(ctx, c.sec, in.X, in.Timestep, in.Guidance, dit.ForwardOptions{TeaCache: &c.tea, MagCache: &c.mag})
}

func (c *cacheModel) InitializeTeaCache(enable bool, numSteps int, th float64) {
	c.tea.Reset(enable, numSteps, th)
}

func (c *cacheModel) InitializeMagCache(enable bool, numSteps int, shape sampler.Shape) error {
	return c.mag.Reset(enable, c.magSet, numSteps, shape.H()*8, shape.W()*8)
}

// runCacheStage samples one section with the stage's cache and records the time and how many
// forwards skipped their blocks.
func runCacheStage(ctx context.Context, rt *runtime.Runtime, m *dit.Model, stage string, res *result, timed func(*runtime.Runtime, *result, int, int, func() error) error) error {
	c, shape, x := ditConditioning(m.Config)
	sec, err := m.Prepare(c, shape)
	if err != nil {
		return err
	}
	defer sec.Close()
	cm := &cacheModel{m: m, sec: sec, magSet: dit.MagCacheSettings{Calibration: dit.MagCacheFramePack, Threshold: dit.DefaultMagCacheThreshold,
		MaxConsecutiveSkips: dit.DefaultMagCacheMaxSkips, RetentionRatio: dit.DefaultMagCacheRetentionRatio}}
	defer cm.tea.Close()
	defer cm.mag.Close()
	opts := sampler.DefaultOptions()
	opts.Steps = sectionSteps
	switch stage {
	case "section_teacache":
		opts.TeaCache = true
	case "section_magcache":
		opts.MagCache = true
	}
	req := sampler.Request{Noise: x, Shape: sampler.Shape(shape), Positive: &c, Options: opts}
	err = timed(rt, res, 1, 2, func() error {
		_, err := sampler.Sample(ctx, cm, req)
		return err
	})
	skipped := cm.tea.Skipped() + cm.mag.Skipped()
	res.Note = fmt.Sprintf("one section of %d steps, cfg 1; blocks skipped in %d of the last run's %d forwards (random weights: TeaCache's skips follow the data and are not those of the real model; MagCache's follow its calibrated ratios)",
		sectionSteps, skipped, len(cm.tea.Calls)+len(cm.mag.Calls))
	return err
}

// isCacheStage reports whether a stage is one of cacheStages.
func isCacheStage(stage string) bool { return strings.HasPrefix(stage, "section_") }
