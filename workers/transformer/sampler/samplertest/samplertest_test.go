package samplertest

import (
	"context"
	"fmt"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// replayModel answers every forward with the velocity that makes the wrapper's x0 the
// reference's recorded data prediction for that step (both branches alike, so CFG and its
// rescale leave it unchanged). It stands in for the transformer to test the driver itself.
type replayModel struct {
	denoised [][]float32
	teaCache int
}

func (m *replayModel) Forward(_ context.Context, in sampler.ForwardInput) ([]float32, error) {
	if in.Step >= len(m.denoised) {
		return nil, fmt.Errorf("step %d not recorded", in.Step)
	}
	d := m.denoised[in.Step]
	v := make([]float32, len(in.X))
	for i, x := range in.X {
		v[i] = float32((float64(x) - float64(d[i])) / float64(in.Sigma))
	}
	return v, nil
}

func (m *replayModel) InitializeTeaCache(bool, int, float64) { m.teaCache++ }

func TestRunParityCaseWithReplayModel(t *testing.T) {
	fx := parity.Load(t, "sampler")
	ran := 0
	for _, c := range fx.Cases {
		if c.Op != OpSampleHunyuan {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			d := Decode(t, c)
			m := &replayModel{}
			for i := 0; i < d.Request.Steps; i++ {
				m.denoised = append(m.denoised, c.Output(t, fmt.Sprintf("step%d_denoised", i)).F32)
			}
			RunParityCase(t, c, m)
			if m.teaCache != 1 {
				t.Errorf("InitializeTeaCache called %d times, want once", m.teaCache)
			}
		})
		ran++
	}
	if ran == 0 {
		t.Fatal("no sample_hunyuan cases")
	}
}
