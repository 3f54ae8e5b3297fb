package pipeline

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// VariantF1 is FramePack-F1 (demo_gradio_f1.py): sections generated forwards in time with the
// F1 transformer (lllyasviel/FramePack_F1_I2V_HY_20250503).
const VariantF1 = "f1"

func init() { variants[VariantF1] = f1{} }

// f1 is FramePack-F1's loop (demo_gradio_f1.py's worker). The history starts as 16+2+1 zero
// frames followed by the start latent (which counts as generated); every section samples the
// window that follows the history, with indices [1 start | 16 4x | 2 2x | 1 1x | window], the
// 4x/2x/1x context taken from the end of the history and the 1x clean latents the start latent
// and the newest history frame; the generated latents are appended at the end. The first
// decode decodes every real frame; later ones decode the newest 2·window latent frames and the
// blend appends their pixels after the history with 4·window−3 overlapping frames.
type f1 struct{}

func (f1) Name() string { return VariantF1 }

func (f1) Prepends() bool { return false }

func (f1) InitialHistory(start vol, end *vol) (vol, int, error) {
	if end != nil {
		// FramePack-Studio has no F1 end frame (its worker's "F1 with Endframe" branch has no
		// model type that reaches it), nor has demo_gradio_f1.py.
		return vol{}, 0, fmt.Errorf("%w: the f1 variant has no end frame (use variant i2v)", errBadInput)
	}
	// torch.cat([zeros(1, 16, 16+2+1, h, w), start_latent], dim=2)
	hist := zeros(start.B, start.C, plan.CleanFrames+start.T, start.H, start.W)
	frames := start.T * start.H * start.W
	for bc := range start.B * start.C {
		dst := hist.Data[(bc*hist.T+plan.CleanFrames)*start.H*start.W:]
		copy(dst[:frames], start.Data[bc*frames:(bc+1)*frames])
	}
	return hist, start.T, nil
}

// f1Indices is arange(0, 1+16+2+1+w) split [1, 16, 2, 1, w]; the 1x indices are the start's
// and the 1x frame's.
func f1Indices(w int) plan.Indices {
	seq := func(from, n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(from + i)
		}
		return out
	}
	const c4, c2, c1 = plan.CleanFrames - plan.Clean1x - plan.Clean2x, plan.Clean2x, plan.Clean1x
	return plan.Indices{
		Clean4x: seq(1, c4),
		Clean2x: seq(1+c4, c2),
		Clean:   append([]int64{0}, seq(1+c4+c2, c1)...),
		Latent:  seq(1+c4+c2+c1, w),
	}
}

func (f1) Context(s Section, start, hist vol) (SectionContext, error) {
	if hist.T < plan.CleanFrames {
		return SectionContext{}, fmt.Errorf("history has %d latent frames, the context needs %d", hist.T, plan.CleanFrames)
	}
	// history_latents[:, :, -19:].split([16, 2, 1], dim=2)
	tail := hist.T - plan.CleanFrames
	c4 := plan.CleanFrames - plan.Clean1x - plan.Clean2x
	clean4x := sliceT(hist, tail, tail+c4)
	clean2x := sliceT(hist, tail+c4, tail+c4+plan.Clean2x)
	clean1x := sliceT(hist, hist.T-plan.Clean1x, hist.T)
	clean, err := concatT(start, clean1x)
	if err != nil {
		return SectionContext{}, fmt.Errorf("clean latents: %w", err)
	}
	return SectionContext{Indices: f1Indices(s.Window), Clean: clean, Clean2x: clean2x, Clean4x: clean4x}, nil
}

func (f1) Append(_ Section, _, hist, generated vol) (vol, int, error) {
	out, err := concatT(hist, generated)
	if err != nil {
		return vol{}, 0, err
	}
	return out, generated.T, nil
}

func (f1) DecodeRange(s Section, latents vol, generated int, first bool) vol {
	real := sliceT(latents, max(latents.T-generated, 0), latents.T) // real_history_latents (the part retained)
	if first {
		return real
	}
	n := min(2*s.Window, real.T) // section_latent_frames
	return sliceT(real, real.T-n, real.T)
}

func (f1) Blend(s Section, current, history vol) (vol, error) {
	// soft_append_bcthw(history_pixels, current_pixels, overlapped_frames)
	return imageproc.SoftAppend(history, current, plan.Overlap(s.Window))
}
