package pipeline

import (
	"fmt"
	"sort"
	"strings"

	"github.com/framepackd/framepackd/internal/imageproc"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// Variant is one way of running FramePack's section loop. The loop (section.go) is the same
// for every variant: it asks the variant for the section's clean-latent context, samples one
// window with the transformer, hands the generated latents back for the history, decodes what
// the variant names and blends the pixels the way the variant says. What differs between
// FramePack's image-to-video loop (demo_gradio.py) and FramePack-F1 (demo_gradio_f1.py) is
// exactly this interface: section order (through the indices and the history layout), the
// clean-latent context, the history append, the decode range, the blend order and the
// initial history.
//
// A Variant holds no per-job state beyond what the job's conditioning file gives it (the video
// variants carry the input video's latents): everything else comes in the arguments, so a
// resumed job gets the same answers from its files alone. Latent volumes are [1, C, T, H, W]
// float32; pixel volumes [1, 3, T, H, W] in [-1, 1].
type Variant interface {
	// Name is the variant's name as checkpoints record it (VariantI2V, …).
	Name() string
	// InitialHistory returns the history latents before the first section (start is the
	// start latent; end, when the job has an end frame, is the end frame's latent already
	// scaled by its strength) and how many of them already count as generated frames. A
	// variant without an end frame fails when end is given.
	InitialHistory(start vol, end *vol) (latents vol, generated int, err error)
	// Context returns section s's frame indices and clean latents 1x/2x/4x, taken from the
	// history latents hist and the start latent.
	Context(s Section, start, hist vol) (SectionContext, error)
	// Append adds section s's generated latents to the history latents: the new history and
	// how many frames it adds to the generated count.
	Append(s Section, start, hist, generated vol) (latents vol, added int, err error)
	// DecodeRange returns the latents section s decodes from the history latents that hold
	// generated frames: all of them for the first section's decode (first), else the newest
	// frames whose pixels the blend replaces.
	DecodeRange(s Section, latents vol, generated int, first bool) vol
	// Blend joins section s's decoded pixels current with the history pixels.
	Blend(s Section, current, history vol) (vol, error)
	// TimeIndex is section s's position in time in the video (0 is the first section after
	// the start frame), whatever order sections are generated in. Timed prompts pick each
	// section's prompt by it.
	TimeIndex(s Section) int
	// Prepends reports whether the history grows at its start (each section earlier in time
	// than the ones before it) rather than at its end: the end a section reads its context
	// from, decodes and blends at, and where its frames go in the video. The frames at the
	// other end are final; a history may drop the latents there (see retain).
	Prepends() bool
}

// Section says which section of a job the loop is at.
type Section struct {
	// Index is the section's 0-based position in generation order.
	Index int
	// Total is the job's number of sections.
	Total int
	// Window is latent_window_size (latent frames sampled per section).
	Window int
}

// Last reports whether s is the job's last section in generation order.
func (s Section) Last() bool { return s.Index == s.Total-1 }

// SectionContext is what one section's transformer request takes from the history.
type SectionContext struct {
	// Indices are the frame indices of the sampled latents and of the clean latents.
	Indices plan.Indices
	// Clean, Clean2x and Clean4x are the clean latents 1x, 2x and 4x.
	Clean, Clean2x, Clean4x vol
}

// Variant names, as checkpoints record them.
const (
	// VariantI2V is FramePack's image-to-video loop (demo_gradio.py): sections generated
	// backwards in time.
	VariantI2V = "i2v"
)

// variants are the variants the loop knows, by name.
var variants = map[string]Variant{
	VariantI2V: i2v{},
}

// VariantNames lists the known variant names, sorted.
func VariantNames() []string {
	out := make([]string, 0, len(variants))
	for n := range variants {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// variantByName returns the named variant; "" is VariantI2V (checkpoints written before
// variants were recorded).
func variantByName(name string) (Variant, error) {
	if name == "" {
		name = VariantI2V
	}
	v, ok := variants[name]
	if !ok {
		return nil, fmt.Errorf("unknown sampling variant %q (known: %s)", name, strings.Join(VariantNames(), ", "))
	}
	return v, nil
}

// i2v is FramePack's image-to-video loop (demo_gradio.py's worker). Sections are generated
// backwards in time: the history holds the newest section first, then the 1+2+16 zero frames
// the reference starts with; latent paddings reversed(range(n)) (or [3, 2…2, 1, 0] when
// n > 4) place each window before the already generated ones; the last section prepends the
// start latent; decodes take the first frames of the history and the blend puts the new
// pixels in front.
type i2v struct{}

func (i2v) Name() string { return VariantI2V }

func (i2v) Prepends() bool { return true }

func (i2v) InitialHistory(start vol, end *vol) (vol, int, error) {
	hist := zeros(start.B, start.C, plan.CleanFrames, start.H, start.W)
	if end == nil {
		return hist, 0, nil
	}
	// FramePack-Studio (modules/pipelines/worker.py, i_section_loop == 0):
	// history_latents[:, :, 0:1] = end_frame_latent × end_frame_strength, so the first
	// generated section (the last in time) has it as clean_latents_post and the later ones
	// find it behind the generated frames in their 2x/4x context.
	if end.B != start.B || end.C != start.C || end.T != 1 || end.H != start.H || end.W != start.W {
		return vol{}, 0, fmt.Errorf("end frame latent %v does not match the start latent %v", end.Shape(), start.Shape())
	}
	frame := start.H * start.W
	for bc := range start.B * start.C {
		copy(hist.Data[bc*hist.T*frame:bc*hist.T*frame+frame], end.Data[bc*frame:(bc+1)*frame])
	}
	return hist, 0, nil
}

func (i2v) Context(s Section, start, hist vol) (SectionContext, error) {
	if hist.T < plan.CleanFrames {
		return SectionContext{}, fmt.Errorf("history has %d latent frames, the context needs %d", hist.T, plan.CleanFrames)
	}
	pad := plan.Paddings(s.Total)[s.Index]
	// Clean latents: the start latent and the newest history frame (1x), then 2 and 16 more
	// history frames (2x, 4x).
	clean, err := concatT(start, sliceT(hist, 0, plan.Clean1x))
	if err != nil {
		return SectionContext{}, fmt.Errorf("clean latents: %w", err)
	}
	return SectionContext{
		Indices: plan.SectionIndices(pad, s.Window),
		Clean:   clean,
		Clean2x: sliceT(hist, plan.Clean1x, plan.Clean1x+plan.Clean2x),
		Clean4x: sliceT(hist, plan.Clean1x+plan.Clean2x, plan.CleanFrames),
	}, nil
}

func (i2v) Append(s Section, start, hist, generated vol) (vol, int, error) {
	// The last section also holds the start latent; the newest frames go first.
	if s.Last() {
		var err error
		if generated, err = concatT(start, generated); err != nil {
			return vol{}, 0, err
		}
	}
	out, err := concatT(generated, hist)
	if err != nil {
		return vol{}, 0, err
	}
	return out, generated.T, nil
}

func (i2v) DecodeRange(s Section, latents vol, generated int, first bool) vol {
	real := sliceT(latents, 0, min(generated, latents.T)) // real_history_latents (the part retained)
	if first {
		return real
	}
	return sliceT(real, 0, min(plan.DecodeFrames(s.Window, s.Last()), real.T))
}

func (i2v) Blend(s Section, current, history vol) (vol, error) {
	// soft_append_bcthw(current_pixels, history_pixels, overlapped_frames)
	return imageproc.SoftAppend(current, history, plan.Overlap(s.Window))
}

// jobVariant is the sampling variant a new job asks for: JobSpec.variant, empty meaning
// VariantI2V.
func jobVariant(spec *framepackv1.JobSpec) string {
	if len(spec.GetInputVideo()) > 0 || spec.GetInputVideoSha256() != "" || spec.GetInputVideoJobId() != "" {
		return jobVideoVariant(spec)
	}
	if v := spec.GetVariant(); v != "" {
		return v
	}
	return VariantI2V
}
