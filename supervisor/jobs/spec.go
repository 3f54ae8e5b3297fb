package jobs

import (
	"math"
	"strconv"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"google.golang.org/protobuf/proto"
)

// Defaults of JobSpec fields whose zero value (or absence) means "the documented default";
// they are FramePack's demo_gradio.py defaults.
const (
	DefaultLatentWindowSize        = 9
	DefaultSteps                   = 25
	DefaultCFG                     = 1.0
	DefaultGS                      = 10.0
	DefaultResolution              = 640
	DefaultMP4CRF                  = 16
	DefaultGPUMemoryPreservationGB = 6.0
	DefaultUseTeaCache             = true
	DefaultLoraStrength            = 1.0
)

// WithDefaults returns a copy of spec with every default filled in, as the Job stores it.
func WithDefaults(spec *framepackv1.JobSpec) *framepackv1.JobSpec {
	s := proto.Clone(spec).(*framepackv1.JobSpec)
	if s.LatentWindowSize == 0 {
		s.LatentWindowSize = DefaultLatentWindowSize
	}
	if s.Steps == 0 {
		s.Steps = DefaultSteps
	}
	if s.Cfg == 0 {
		s.Cfg = DefaultCFG
	}
	if s.Gs == 0 {
		s.Gs = DefaultGS
	}
	if s.Resolution == 0 {
		s.Resolution = DefaultResolution
	}
	if s.UseTeacache == nil {
		s.UseTeacache = proto.Bool(DefaultUseTeaCache)
	}
	if s.Mp4Crf == nil {
		s.Mp4Crf = proto.Uint32(DefaultMP4CRF)
	}
	for _, l := range s.Loras {
		if l.Strength == 0 {
			l.Strength = DefaultLoraStrength
		}
	}
	if s.GpuMemoryPreservationGb == nil {
		s.GpuMemoryPreservationGb = proto.Float32(DefaultGPUMemoryPreservationGB)
	}
	return s
}

// TotalSections is FramePack's section count for a spec with defaults filled in:
// int(max(round(total_second_length·30 / (latent_window_size·4)), 1)), with Python's round
// (halves to even). The float32 length is read as the shortest decimal that prints it ("4.2",
// not 4.19999980926…) and computed in float64, so a length typed as a decimal gives the count
// the reference computes from the same decimal.
func TotalSections(spec *framepackv1.JobSpec) int {
	w := spec.GetLatentWindowSize()
	if w == 0 {
		w = DefaultLatentWindowSize
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
