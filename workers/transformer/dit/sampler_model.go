package dit

import (
	"context"
	"fmt"
	"slices"

	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// ConditioningFrom converts the sampler's conditioning (same tensors, host memory) to the
// model's.
func ConditioningFrom(c *sampler.Conditioning) Conditioning {
	return Conditioning{
		EncoderHiddenStates:  Tensor(c.EncoderHiddenStates),
		EncoderAttentionMask: IntTensor(c.EncoderAttentionMask),
		PooledProjections:    Tensor(c.PooledProjections),
		ImageEmbeddings:      Tensor(c.ImageEmbeddings),
		LatentIndices:        IntTensor(c.LatentIndices),
		CleanLatents:         Tensor(c.CleanLatents),
		CleanLatentIndices:   IntTensor(c.CleanLatentIndices),
		CleanLatents2x:       Tensor(c.CleanLatents2x),
		CleanLatent2xIndices: IntTensor(c.CleanLatent2xIndices),
		CleanLatents4x:       Tensor(c.CleanLatents4x),
		CleanLatent4xIndices: IntTensor(c.CleanLatent4xIndices),
	}
}

// SamplerModel is a Model as the sampler drives it (sampler.TeaCacheModel): one Section per
// conditioning branch (taken from Conditioning.Prepared when it holds a *Section, else prepared
// on first use and owned here), one TeaCache per branch. Use one SamplerModel per section and
// Close it after.
type SamplerModel struct {
	Model *Model
	// OnForward, when set, is called before every forward (progress, beacon).
	OnForward func(in sampler.ForwardInput)

	sections map[*sampler.Conditioning]*Section
	teacache [2]TeaCache
}

var _ sampler.TeaCacheModel = (*SamplerModel)(nil)

// NewSamplerModel wraps m.
func NewSamplerModel(m *Model) *SamplerModel {
	return &SamplerModel{Model: m, sections: map[*sampler.Conditioning]*Section{}}
}

// InitializeTeaCache resets both branches' TeaCache (the reference's initialize_teacache).
func (s *SamplerModel) InitializeTeaCache(enable bool, numSteps int, relL1Threshold float64) {
	for i := range s.teacache {
		s.teacache[i].Reset(enable, numSteps, relL1Threshold)
	}
}

// TeaCache returns a branch's TeaCache state (its Calls say which forwards were skipped).
func (s *SamplerModel) TeaCache(b sampler.Branch) *TeaCache { return &s.teacache[b] }

// Forward implements sampler.Model.
func (s *SamplerModel) Forward(ctx context.Context, in sampler.ForwardInput) ([]float32, error) {
	if in.Cond == nil {
		return nil, invalidf("%s branch has no conditioning", in.Branch)
	}
	if in.Branch != sampler.Positive && in.Branch != sampler.Negative {
		return nil, invalidf("branch %d", int(in.Branch))
	}
	sec, ok := in.Cond.Prepared.(*Section)
	if !ok || sec == nil {
		if sec = s.sections[in.Cond]; sec == nil {
			var err error
			sec, err = s.Model.Prepare(ConditioningFrom(in.Cond), [5]int(in.Shape))
			if err != nil {
				return nil, fmt.Errorf("%s branch: %w", in.Branch, err)
			}
			s.sections[in.Cond] = sec
		}
	}
	if !slices.Equal(sec.shape[:], in.Shape[:]) {
		return nil, invalidf("latents %v, the section was prepared for %v", in.Shape, sec.shape)
	}
	if s.OnForward != nil {
		s.OnForward(in)
	}
	return s.Model.Forward(ctx, sec, in.X, in.Timestep, in.Guidance, ForwardOptions{TeaCache: &s.teacache[in.Branch]})
}

// Close frees the sections prepared here and the TeaCache residuals.
func (s *SamplerModel) Close() {
	for k, sec := range s.sections {
		sec.Close()
		delete(s.sections, k)
	}
	for i := range s.teacache {
		s.teacache[i].Close()
	}
}
