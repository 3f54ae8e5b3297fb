// Package plan is the arithmetic of a FramePack image-to-video job that needs no model: which
// bucket table a spec uses (and whether the spec's table is valid), the section paddings, and
// each section's frame indices and clean-latent slices, as demo_gradio.py's worker computes
// them. It is pure Go so that the API can validate specs with it.
package plan

import (
	"fmt"
	"math"
	"strconv"

	"github.com/framepackd/framepackd/internal/imageproc"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TinyResolution labels the bucket table of the tiny test models (testdata/parity/models, made
// at FramePack's shapes with a small bucket table); `--resolution 96` runs them quickly on a CPU.
const TinyResolution = 96

// tinyBuckets is the bucket table the pipeline fixture of testdata/parity uses at resolution 96.
var tinyBuckets = []imageproc.Bucket{{Height: 64, Width: 96}, {Height: 80, Width: 80}, {Height: 96, Width: 64}}

// Limits of JobSpec.buckets.
const (
	MaxBuckets    = 64
	MinBucketSide = 16
	MaxBucketSide = 2048
	// BucketMultiple is what every bucket side must be a multiple of: the VAE's 8× spatial
	// compression times the transformer's 2× patch.
	BucketMultiple = 16
)

// KnownTable returns the bucket table the server knows for a resolution: FramePack's 640 table,
// or the tiny test models' table at TinyResolution.
func KnownTable(resolution int) ([]imageproc.Bucket, bool) {
	if resolution == TinyResolution {
		return append([]imageproc.Bucket(nil), tinyBuckets...), true
	}
	return imageproc.BucketTable(resolution)
}

// FramePackResolution names FramePack's own bucket table (bucket_options[640]), the default of
// its full-size models.
const FramePackResolution = 640

// KnownResolutions lists the resolutions KnownTable has a table for.
func KnownResolutions() []int { return []int{FramePackResolution, TinyResolution} }

// TableLabel says whose bucket table a known resolution names.
func TableLabel(resolution int) string {
	switch resolution {
	case FramePackResolution:
		return "FramePack"
	case TinyResolution:
		return "tiny test models"
	}
	return ""
}

// Violation is one bad field of a spec.
type Violation struct {
	// Field is the field's path ("spec.buckets[1].width").
	Field string
	// Description says what is wrong.
	Description string
}

// CheckBuckets checks spec.resolution and spec.buckets: with buckets, every bucket's sides must
// be multiples of 16 in [16, 2048] and resolution, if set, in [16, 2048]; without, resolution
// must name a known table (0 means 640).
func CheckBuckets(spec *framepackv1.JobSpec) []Violation {
	var v []Violation
	add := func(field, format string, args ...any) {
		v = append(v, Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	bs := spec.GetBuckets()
	r := spec.GetResolution()
	if len(bs) == 0 {
		if r != 0 {
			if _, ok := KnownTable(int(r)); !ok {
				add("spec.resolution", "no bucket table for %d (known: 640, and %d for the tiny test models; 0 means 640; or give spec.buckets)", r, TinyResolution)
			}
		}
		return v
	}
	if len(bs) > MaxBuckets {
		add("spec.buckets", "%d buckets, the limit is %d", len(bs), MaxBuckets)
	}
	for i, b := range bs {
		for _, side := range []struct {
			name string
			px   uint32
		}{{"height", b.GetHeight()}, {"width", b.GetWidth()}} {
			if side.px < MinBucketSide || side.px > MaxBucketSide || side.px%BucketMultiple != 0 {
				add(fmt.Sprintf("spec.buckets[%d].%s", i, side.name), "must be a multiple of %d from %d to %d, got %d",
					BucketMultiple, MinBucketSide, MaxBucketSide, side.px)
			}
		}
	}
	if r != 0 && (r < MinBucketSide || r > MaxBucketSide) {
		add("spec.resolution", "with spec.buckets it only labels the table and must be %d to %d, got %d", MinBucketSide, MaxBucketSide, r)
	}
	return v
}

// Buckets returns the bucket table of a spec with defaults filled in (api.WithDefaults):
// spec.buckets, else the known table of its resolution.
func Buckets(spec *framepackv1.JobSpec) ([]imageproc.Bucket, error) {
	if v := CheckBuckets(spec); len(v) > 0 {
		return nil, fmt.Errorf("bucket table: %s: %s", v[0].Field, v[0].Description)
	}
	if bs := spec.GetBuckets(); len(bs) > 0 {
		out := make([]imageproc.Bucket, len(bs))
		for i, b := range bs {
			out[i] = imageproc.Bucket{Height: int(b.GetHeight()), Width: int(b.GetWidth())}
		}
		return out, nil
	}
	r := int(spec.GetResolution())
	t, ok := KnownTable(r)
	if !ok {
		return nil, fmt.Errorf("bucket table: no table for resolution %d", r)
	}
	return t, nil
}

// DefaultLatentWindowSize is latent_window_size when a spec leaves it 0 (demo_gradio.py's 9).
const DefaultLatentWindowSize = 9

// Defaults of the other JobSpec fields whose absence (or zero) means "the default":
// demo_gradio.py's values. The API fills them in, once (api.WithDefaults); clients (the CLI)
// show them, and this package is the one both may import.
const (
	DefaultSeed                    = 31337
	DefaultSteps                   = 25
	DefaultCFG                     = 1.0
	DefaultGS                      = 10.0
	DefaultMP4CRF                  = 16
	DefaultGPUMemoryPreservationGB = 6.0
	DefaultUseTeaCache             = true
	DefaultLoraStrength            = 1.0
	DefaultEndStrength             = 1.0
	// FramePack-Studio's MagCache defaults (modules/interface.py) and the default step cache.
	DefaultMagCacheThreshold      = 0.1
	DefaultMagCacheMaxSkips       = 2
	DefaultMagCacheRetentionRatio = 0.25
	DefaultCache                  = CacheTeaCache
	// DefaultVideoContextFrames is video_context_frames of a job that extends a video,
	// FramePack-Studio's num_cleaned_frames default.
	DefaultVideoContextFrames = 5
	// DefaultVideoIncludeInput is video_include_input of a job that extends a video: the output
	// starts with the input video's frames, as FramePack-Studio's does.
	DefaultVideoIncludeInput = true
)

// VideoContextLatents is FramePack-Studio's min_real_frames_to_encode's
// max_latents_used_for_context (modules/generators/video_base_generator.py): the most latent
// frames of an input video's end that are encoded (4 pixel frames each).
const VideoContextLatents = 27

// VideoTrimmedFrames is how many of n input video frames FramePack-Studio encodes: the last
// min(n, 4·VideoContextLatents), floored to a multiple of 4.
func VideoTrimmedFrames(n int) int { return min(n, 4*VideoContextLatents) / 4 * 4 }

// TotalSections is FramePack's section count for a spec with defaults filled in
// (api.WithDefaults): int(max(round(total_second_length·30 / (latent_window_size·4)), 1)),
// with Python's round (halves to even). The float32 length is read as the shortest decimal
// that prints it ("4.2", not 4.19999980926…) and computed in float64, so a length typed as a
// decimal gives the count the reference computes from the same decimal. A spec without a
// window (no defaults) counts one section.
func TotalSections(spec *framepackv1.JobSpec) int {
	w := spec.GetLatentWindowSize()
	if w == 0 {
		return 1
	}
	seconds, err := strconv.ParseFloat(strconv.FormatFloat(float64(spec.GetTotalSecondLength()), 'g', -1, 32), 64)
	if err != nil {
		return 1
	}
	n := math.RoundToEven(seconds * 30 / float64(w*4))
	if n < 1 || math.IsNaN(n) {
		return 1
	}
	return int(n)
}

// Paddings returns the latent padding of every section in generation order:
// reversed(range(n)), or [3, 2, …, 2, 1, 0] when n > 4 (demo_gradio.py: duplicating 2 looks
// better than expanding the padding). n < 1 is treated as 1.
func Paddings(n int) []int {
	n = max(n, 1)
	out := make([]int, 0, n)
	if n > 4 {
		out = append(out, 3)
		for range n - 3 {
			out = append(out, 2)
		}
		return append(out, 1, 0)
	}
	for p := n - 1; p >= 0; p-- {
		out = append(out, p)
	}
	return out
}

// History frame counts of the clean context (demo_gradio.py: 1 + 2 + 16 latent frames).
const (
	Clean1x     = 1
	Clean2x     = 2
	Clean4x     = 16
	CleanFrames = Clean1x + Clean2x + Clean4x
)

// Indices are one section's frame indices, as torch.arange(0, 1+pad+w+1+2+16) split
// [1, pad, w, 1, 2, 16].
type Indices struct {
	// Latent are the indices of the latents being sampled.
	Latent []int64
	// Clean are the indices of the 1x clean latents: the start frame's and the newest
	// history frame's.
	Clean []int64
	// Clean2x and Clean4x are the indices of the 2x and 4x clean latents.
	Clean2x, Clean4x []int64
}

// SectionIndices returns the indices of a section with latent padding pad (in sections) and
// window w latent frames.
func SectionIndices(pad, w int) Indices {
	padSize := pad * w
	seq := func(from, n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(from + i)
		}
		return out
	}
	post := 1 + padSize + w
	return Indices{
		Latent:  seq(1+padSize, w),
		Clean:   []int64{0, int64(post)},
		Clean2x: seq(post+1, Clean2x),
		Clean4x: seq(post+1+Clean2x, Clean4x),
	}
}

// Frames is the number of pixel frames a window of w latent frames samples (w·4 − 3).
func Frames(w int) int { return w*4 - 3 }

// DecodeFrames is how many of the newest history latent frames a section decodes after the
// first: 2w, or 2w + 1 for the last section (it holds the start latent too).
func DecodeFrames(w int, last bool) int {
	if last {
		return 2*w + 1
	}
	return 2 * w
}

// Overlap is the number of pixel frames soft-blended between a section and the history
// (w·4 − 3).
func Overlap(w int) int { return w*4 - 3 }

// DiskBytes is about the most disk a job of spec (every default filled in) holds at once: its
// checkpoint (history pixels as float32, the bulk, plus the latents) and its video, each
// twice, because the next one is written before the previous one is removed. The frame size is
// the largest of the spec's buckets, or resolution² for a server table.
func DiskBytes(spec *framepackv1.JobSpec) int64 {
	area := int64(spec.GetResolution()) * int64(spec.GetResolution())
	for _, b := range spec.GetBuckets() {
		area = max(area, int64(b.GetHeight())*int64(b.GetWidth()))
	}
	frames := int64(TotalSections(spec))*int64(spec.GetLatentWindowSize())*4 + 1
	pixels := frames * area * 3 * 4                   // float32 RGB history
	latents := (frames/4 + 20) * 16 * (area / 64) * 4 // float32, 16 channels at 1/8 size
	video := frames * area / 2                        // H.264 at high quality: under 4 bits a pixel
	return 2*(pixels+latents) + 2*video + 1<<20       // + spec, events, conditioning slack
}
