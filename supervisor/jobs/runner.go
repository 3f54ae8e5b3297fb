package jobs

import (
	"context"
	"errors"
	"fmt"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"google.golang.org/protobuf/proto"
)

// Runner runs one job: the FramePack section loop (supervisor/pipeline), which starts and
// kills the model workers. The queue calls Run on its own goroutine, one job per lane at a
// time, and the job is over for the queue when Run returns.
//
// What the queue expects of a Runner:
//
//   - Start at job.Resume when it is not nil (the sections up to and including
//     job.Resume.Section are finished and their files are in job.Dir); else from scratch.
//   - After each finished section: write the history (latents, pixels, generator state) into
//     job.Dir.History() and the section's video into job.Dir.Videos() (complete files only:
//     write "*.partial" and rename), call job.SaveCheckpoint, then emit SectionVideo.
//   - Emit progress through emit, from any goroutine: StageStarted/StageFinished for every
//     stage (section_index set for per-section stages), SamplingStep after every step (with
//     eta), StageProgress after each model run of a VAE decode, SectionVideo after every MP4, and Preview, MemoryTelemetry, Fallback, Retry as
//     they happen. job_id and time are filled in when empty. emit never blocks on watchers
//     (it does write the event to the job store). Terminal events and snapshots are the
//     queue's: a Runner never emits them.
//   - Stop promptly when ctx is cancelled (the job was cancelled, or the daemon's shutdown
//     grace ran out): kill the worker, remove what is half-written, return ctx's error.
//   - When job.Draining is closed the daemon is shutting down: finish the current stage if
//     it can, save the checkpoint, and return ErrInterrupted; the job resumes at the next
//     start.
//   - Return the final video in Result, or an error. To give the whole story of a failure
//     (every attempt, the stage that gave up), return a *FailureError.
type Runner interface {
	Run(ctx context.Context, job *Job, emit func(*framepackv1.JobEvent)) (Result, error)
}

// RunnerFunc adapts a function to Runner.
type RunnerFunc func(ctx context.Context, job *Job, emit func(*framepackv1.JobEvent)) (Result, error)

// Run calls f.
func (f RunnerFunc) Run(ctx context.Context, job *Job, emit func(*framepackv1.JobEvent)) (Result, error) {
	return f(ctx, job, emit)
}

// Job is what a Runner gets: one job's parameters, its files and where to resume.
type Job struct {
	// ID is the job's id.
	ID string
	// Spec is the job's spec with every default filled in. Read only.
	Spec *framepackv1.JobSpec
	// Lane is the lane ("cpu", "cuda:0") the job runs on.
	Lane string
	// Dir is the job's state directory.
	Dir Dir
	// InputPath is the submitted image, as it was uploaded (PNG, JPEG or WebP).
	InputPath string
	// EndImagePath is the submitted end image (JobSpec.end_image), "" when the job has none.
	EndImagePath string
	// KeyframePaths are the keyframe images (JobSpec.keyframes, in order).
	KeyframePaths []string
	// VideoPath is the input video of a job that extends one (JobSpec.input_video), "" else;
	// InputPath is then "".
	VideoPath string
	// TotalSections is the job's section count (Config.Sections).
	TotalSections int
	// Resume is the last finished section when the job ran before (a restart, a graceful
	// stop); nil to start from scratch.
	Resume *Checkpoint
	// Draining is closed when the daemon is shutting down; see Runner.
	Draining <-chan struct{}

	saveCheckpoint func(Checkpoint) error
}

// SaveCheckpoint durably records cp as the job's resume point. The files it names must
// already be complete on disk.
func (j *Job) SaveCheckpoint(cp Checkpoint) error {
	if j.saveCheckpoint == nil {
		return fmt.Errorf("save checkpoint of job %s: job has no store", j.ID)
	}
	return j.saveCheckpoint(cp)
}

// Result is what a finished Runner produced.
type Result struct {
	// VideoPath is the final MP4, or the PNG directory when PNGFrames is set.
	VideoPath string
	// FrameCount is the number of frames of the final video.
	FrameCount int
	// PNGFrames says the video was kept as PNG frames because ffmpeg was missing
	// (video.FormatPNG); JobResult.video_path then names a directory.
	PNGFrames bool
}

// ErrInterrupted is what a Runner returns when it stopped because the daemon drains; the job
// stays queued and resumes from its checkpoint at the next start.
var ErrInterrupted = errors.New("jobs: interrupted by shutdown")

// ErrCancelled is the cause of a cancelled job's context.
var ErrCancelled = errors.New("jobs: job cancelled")

// ErrShutdown is the cause of a job's context cancelled by the daemon's shutdown.
var ErrShutdown = errors.New("jobs: daemon shutting down")

// FailureError is a Runner error that carries the whole story of a failed job.
type FailureError struct {
	// Failure is stored as Job.failure; its message should be lower-case.
	Failure *framepackv1.JobFailure
}

// Error returns the failure's message.
func (e *FailureError) Error() string { return e.Failure.GetMessage() }

func failureOf(err error, p *framepackv1.JobProgress) *framepackv1.JobFailure {
	var fe *FailureError
	if errors.As(err, &fe) && fe.Failure != nil {
		f := proto.Clone(fe.Failure).(*framepackv1.JobFailure)
		if f.Message == "" {
			f.Message = err.Error()
		}
		return f
	}
	return &framepackv1.JobFailure{
		Message:      err.Error(),
		Stage:        p.GetStage(),
		SectionIndex: p.GetSectionIndex(),
	}
}
