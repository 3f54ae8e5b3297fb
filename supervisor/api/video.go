package api

import (
	"context"
	"errors"
	"fmt"
	"os"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"github.com/framepackd/framepackd/supervisor/video"
	"google.golang.org/protobuf/proto"
)

// DefaultMaxVideoBytes is the largest input video by default (--max-video-bytes; plan's limits
// table).
const DefaultMaxVideoBytes = plan.DefaultMaxVideoBytes

// DefaultVideoLimits are the daemon's default bounds on an input video (plan's limits table).
var DefaultVideoLimits = video.Limits{MaxSeconds: plan.DefaultMaxVideoSeconds, MaxFrames: plan.DefaultMaxVideoFrames,
	MaxPixels: plan.DefaultMaxVideoPixels}

// withSourceVideo fills in the video of the job JobSpec.input_video_job_id names (its final MP4),
// so that the new job keeps a copy of it.
func (s *Server) withSourceVideo(req *framepackv1.SubmitJobRequest) (*framepackv1.SubmitJobRequest, error) {
	id := req.GetSpec().GetInputVideoJobId()
	if id == "" {
		return req, nil
	}
	var v Violations
	field := "spec.input_video_job_id"
	if len(req.GetSpec().GetInputVideo()) > 0 {
		v.Add(field, "the video is given twice: send input_video or input_video_job_id")
		return nil, v.Err("SubmitJobRequest")
	}
	job, err := s.cfg.Store.Get(id)
	switch {
	case errors.Is(err, jobs.ErrNotFound) || (err == nil && !jobs.ValidID(id)):
		v.Add(field, "no job %q on this server", id)
	case err != nil:
		return nil, statusOf(err)
	case job.GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED:
		v.Add(field, "job %s is %s: only a succeeded job's video can be extended", id, job.GetState())
	}
	if len(v) > 0 {
		return nil, v.Err("SubmitJobRequest")
	}
	path := job.GetResult().GetVideoPath()
	st, err := os.Stat(path)
	switch {
	case err != nil || st.IsDir():
		v.Add(field, "job %s has no MP4 to extend (%s)", id, path)
	case st.Size() > int64(s.cfg.MaxVideoBytes):
		v.Add(field, "job %s's video is %d bytes, the limit is %d (--max-video-bytes)", id, st.Size(), s.cfg.MaxVideoBytes)
	}
	if len(v) > 0 {
		return nil, v.Err("SubmitJobRequest")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, statusOf(fmt.Errorf("read job %s's video: %w", id, err))
	}
	out := proto.Clone(req).(*framepackv1.SubmitJobRequest)
	out.Spec.InputVideo = data
	return out, nil
}

// checkVideoSpec checks the fields of a job that extends a video that need no decoding: the
// settings that go with a video only with one, no end frame, the context frames' range.
func checkVideoSpec(v *Violations, s *framepackv1.JobSpec) {
	if !extendsVideo(s) {
		if s.GetInputVideoSha256() != "" {
			v.Add("spec.input_video_sha256", "is set by the server; send the video itself in input_video")
		}
		if s.VideoContextFrames != nil {
			v.Add("spec.video_context_frames", "set without an input video: give the video too, or leave it unset")
		}
		if s.VideoIncludeInput != nil {
			v.Add("spec.video_include_input", "set without an input video: give the video too, or leave it unset")
		}
		return
	}
	if len(s.GetEndImage()) > 0 {
		v.Add("spec.end_image", "a job that extends a video takes no end frame")
	}
	for _, fv := range plan.CheckVideoContextFrames(s) {
		v.Add(fv.Field, "%s", fv.Description)
	}
}

// checkVideo probes a request's input video with ffprobe: readable, within the size and the
// limits, long enough for the job (4 frames; Studio's Video F1 needs max(window, 3) latent
// frames of the video's last 108 frames).
func (s *Server) checkVideo(ctx context.Context, v *Violations, spec *framepackv1.JobSpec) {
	data := spec.GetInputVideo()
	if len(data) == 0 {
		return
	}
	field := "spec.input_video"
	if spec.GetInputVideoJobId() != "" {
		field = "spec.input_video_job_id"
	}
	if len(data) > s.cfg.MaxVideoBytes {
		v.Add(field, "%d bytes, the limit is %d (--max-video-bytes)", len(data), s.cfg.MaxVideoBytes)
		return
	}
	if _, err := s.cfg.Video.Available(); err != nil {
		v.Add(field, "this server cannot extend videos: it has no ffmpeg (%v)", err)
		return
	}
	f, err := os.CreateTemp("", "framepackd-video-*")
	if err != nil {
		v.Add(field, "cannot check the video: %v", err)
		return
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		v.Add(field, "cannot check the video: %v", err)
		return
	}
	info, err := s.cfg.Video.Probe(ctx, f.Name())
	if err == nil {
		err = s.cfg.VideoLimits.Check(info)
	}
	if err != nil {
		v.Add(field, "%v", err)
		return
	}
	latents := plan.VideoTrimmedFrames(info.Frames) / 4
	w := int(spec.GetLatentWindowSize())
	if w == 0 {
		w = plan.DefaultLatentWindowSize
	}
	switch {
	case latents < 1:
		v.Add(field, "%d frames: extending a video needs at least 4", info.Frames)
	case spec.GetVariant() == "f1" && latents < max(w, 3):
		v.Add(field, "%d frames give %d latent frames; the f1 variant with latent_window_size %d needs %d (%d frames): use a longer video or a smaller window",
			info.Frames, latents, w, max(w, 3), 4*max(w, 3))
	}
}
