package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/framepackd/framepackd/workers/transformer/dit"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// samplerModel is the packed DiT as the sampler drives it (sampler.TeaCacheModel): one
// dit.Section per conditioning branch (prepared ahead with prepare, or on first use), one
// TeaCache per branch. Use one per section and close it after. The adapter lives here, where
// the worker puts the model and the sampler together, so dit does not depend on the sampler.
type samplerModel struct {
	model *dit.Model
	// onForward, when set, is called before every forward (progress, beacon).
	onForward func(in sampler.ForwardInput)

	sections map[*sampler.Conditioning]*dit.Section
	teacache [2]dit.TeaCache
	// magSettings are the MagCache settings InitializeMagCache applies; magcache is one
	// MagCache per branch.
	magSettings dit.MagCacheSettings
	magcache    [2]dit.MagCache
}

var (
	_ sampler.TeaCacheModel = (*samplerModel)(nil)
	_ sampler.MagCacheModel = (*samplerModel)(nil)
)

func newSamplerModel(m *dit.Model) *samplerModel {
	return &samplerModel{model: m, sections: map[*sampler.Conditioning]*dit.Section{}}
}

// InitializeTeaCache resets both branches' TeaCache (the reference's initialize_teacache).
func (s *samplerModel) InitializeTeaCache(enable bool, numSteps int, relL1Threshold float64) {
	for i := range s.teacache {
		s.teacache[i].Reset(enable, numSteps, relL1Threshold)
	}
}

// teaCache returns a branch's TeaCache state (its Calls say which forwards were skipped).
func (s *samplerModel) teaCache(b sampler.Branch) *dit.TeaCache { return &s.teacache[b] }

// InitializeMagCache resets both branches' MagCache with the model's settings for a section of
// numSteps steps whose latents have the given shape (8 pixels a latent).
func (s *samplerModel) InitializeMagCache(enable bool, numSteps int, shape sampler.Shape) error {
	for i := range s.magcache {
		if err := s.magcache[i].Reset(enable, s.magSettings, numSteps, shape.H()*8, shape.W()*8); err != nil {
			return err
		}
	}
	return nil
}

// cacheCalls returns what the positive branch's block cache did at each forward (nil without a
// cache).
func (s *samplerModel) cacheCalls() []dit.CacheCall {
	if s.magcache[sampler.Positive].Enabled {
		return s.magcache[sampler.Positive].Calls
	}
	if s.teacache[sampler.Positive].Enabled {
		return s.teacache[sampler.Positive].Calls
	}
	return nil
}

// cacheSkipped is the number of forwards of both branches whose blocks a cache skipped.
func (s *samplerModel) cacheSkipped() int {
	n := 0
	for i := range s.teacache {
		n += s.teacache[i].Skipped() + s.magcache[i].Skipped()
	}
	return n
}

// prepare embeds c for latents of shape once (dit.Model.Prepare); forwards of c use it.
func (s *samplerModel) prepare(c *sampler.Conditioning, shape sampler.Shape) (*dit.Section, error) {
	if sec := s.sections[c]; sec != nil {
		return sec, nil
	}
	sec, err := s.model.Prepare(*c, [5]int(shape))
	if err != nil {
		return nil, err
	}
	s.sections[c] = sec
	return sec, nil
}

// Forward implements sampler.Model.
func (s *samplerModel) Forward(ctx context.Context, in sampler.ForwardInput) ([]float32, error) {
	if in.Cond == nil {
		return nil, fmt.Errorf("%w: %s branch has no conditioning", dit.ErrInvalidInput, in.Branch)
	}
	if in.Branch != sampler.Positive && in.Branch != sampler.Negative {
		return nil, fmt.Errorf("%w: branch %d", dit.ErrInvalidInput, int(in.Branch))
	}
	sec, err := s.prepare(in.Cond, in.Shape)
	if err != nil {
		return nil, fmt.Errorf("%s branch: %w", in.Branch, err)
	}
	if shape := sec.Shape(); !slices.Equal(shape[:], in.Shape[:]) {
		return nil, fmt.Errorf("%w: latents %v, the section was prepared for %v", dit.ErrInvalidInput, in.Shape, shape)
	}
	if s.onForward != nil {
		s.onForward(in)
	}
	return s.model.Forward(ctx, sec, in.X, in.Timestep, in.Guidance, dit.ForwardOptions{TeaCache: &s.teacache[in.Branch], MagCache: &s.magcache[in.Branch]})
}

// Close frees the sections and the TeaCache residuals.
func (s *samplerModel) Close() {
	for k, sec := range s.sections {
		sec.Close()
		delete(s.sections, k)
	}
	for i := range s.teacache {
		s.teacache[i].Close()
		s.magcache[i].Close()
	}
}
