package plan

import (
	"fmt"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// The bounds of a job, in one table: the API refuses a submitted spec outside them (with the
// field and the range), and the pipeline checks a stored spec against them again before it
// runs it (a job stored by another version, or written by hand).
const (
	// MaxSecondLength bounds total_second_length: (0, MaxSecondLength] seconds.
	MaxSecondLength = 120
	// MinLatentWindowSize and MaxLatentWindowSize bound latent_window_size.
	MinLatentWindowSize, MaxLatentWindowSize = 1, 33
	// MinSteps and MaxSteps bound steps.
	MinSteps, MaxSteps = 1, 100
	// MaxMP4CRF bounds mp4_crf (x264's scale).
	MaxMP4CRF = 51
	// MaxGPUMemoryPreservationGB bounds gpu_memory_preservation_gb.
	MaxGPUMemoryPreservationGB = 128
	// MaxKeepAlive bounds keep_alive: a day.
	MaxKeepAlive = 24 * time.Hour
	// DefaultMaxImagePixels is the largest start or end image (width × height) a daemon takes
	// unless told otherwise (framepackd --max-image-pixels): the API checks it from the
	// header before decoding and the pipeline's decoder holds the job's images to the same.
	DefaultMaxImagePixels = 40_000_000
)

// CheckRun checks what the section loop relies on in a spec with every default filled in:
// the window and the step count within the table's bounds.
func CheckRun(spec *framepackv1.JobSpec) error {
	if w := spec.GetLatentWindowSize(); w < MinLatentWindowSize || w > MaxLatentWindowSize {
		return fmt.Errorf("latent_window_size %d (%d to %d)", w, MinLatentWindowSize, MaxLatentWindowSize)
	}
	if n := spec.GetSteps(); n < MinSteps || n > MaxSteps {
		return fmt.Errorf("steps %d (%d to %d)", n, MinSteps, MaxSteps)
	}
	return nil
}
