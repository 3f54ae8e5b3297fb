package dit

import (
	"math"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// HunyuanVideoRotaryPosEmbed is the model's rope: per token (t, y, x) the rotation angles of
// the head dim's three parts (rope_axes_dim = DT, DY, DX), t taken from the given frame indices.
// It has no weights. The reference computes the table in float32 (so does this).
type HunyuanVideoRotaryPosEmbed struct {
	AxesDim [3]int
	Theta   float64
}

// axisFreqs is get_frequency's 1/θ^(2i/dim) for i < dim/2, each rounded to float32 as torch's
// float32 arange, division, power and reciprocal leave them.
func (r HunyuanVideoRotaryPosEmbed) axisFreqs(dim int) []float32 {
	out := make([]float32, dim/2)
	for i := range out {
		e := float32(float32(2*i) / float32(dim))
		pw := float32(math.Pow(r.Theta, float64(e)))
		out[i] = float32(1 / pw)
	}
	return out
}

// table is forward_inner for one batch item: [2·D, T, H, W] with rows
// cos(t) (DT rows), cos(y) (DY), cos(x) (DX), then the sines in the same order; each frequency
// fills two consecutive rows (repeat_interleave(2)), matching the interleaved-pair rotation.
func (r HunyuanVideoRotaryPosEmbed) table(frames []int64, h, w int) []float32 {
	d := r.AxesDim[0] + r.AxesDim[1] + r.AxesDim[2]
	t := len(frames)
	plane := t * h * w
	out := make([]float32, 2*d*plane)
	row := 0
	for axis, dim := range r.AxesDim {
		for i, f := range r.axisFreqs(dim) {
			for k := range 2 {
				cos := out[(row+2*i+k)*plane:]
				sin := out[(d+row+2*i+k)*plane:]
				n := 0
				for ti := range t {
					for yi := range h {
						for xi := range w {
							var pos float32
							switch axis {
							case 0:
								pos = float32(frames[ti])
							case 1:
								pos = float32(yi)
							default:
								pos = float32(xi)
							}
							a := float64(float32(f * pos))
							cos[n] = float32(math.Cos(a))
							sin[n] = float32(math.Sin(a))
							n++
						}
					}
				}
			}
		}
		row += dim
	}
	return out
}

// Forward returns the rope table of a (T, H, W) grid with frame indices frames, average-pooled
// by pool (the reference's pad_for_3d_conv + center_down_sample_3d for the 2x and 4x context;
// {1,1,1} for none), as [1, L, 2·D] tokens in (t, h, w) order: cos in the first D columns, sin
// in the last D (the reference's rope_freqs).
func (r HunyuanVideoRotaryPosEmbed) Forward(p *nn.Pass, frames []int64, h, w int, pool [3]int) *runtime.Tensor {
	d := r.AxesDim[0] + r.AxesDim[1] + r.AxesDim[2]
	tab := p.Do(p.RT.FromFloat32(r.table(frames, h, w), 1, 2*d, len(frames), h, w))
	if pool != [3]int{1, 1, 1} {
		tab = padTo(p, tab, pool)
		tab = p.Do(p.RT.AvgPool3d(tab, pool, pool))
	}
	if !p.OK() {
		return nil
	}
	flat := p.Reshape(tab, 1, 2*d, -1)
	return p.Do(p.RT.Permute(flat, 0, 2, 1))
}
