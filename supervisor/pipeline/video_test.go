package pipeline_test

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// movingFrames makes n frames of the case's image, each shifted one more pixel to the right
// (wrapping), uint8 [n, H, W, 3] as int64s.
func movingFrames(img parity.Array, n int) []int64 {
	h, w := int(img.Shape[0]), int(img.Shape[1])
	out := make([]int64, 0, n*h*w*3)
	for f := range n {
		for y := range h {
			for x := range w {
				src := (y*w + (x+f)%w) * 3
				out = append(out, img.Ints[src:src+3]...)
			}
		}
	}
	return out
}

// TestVideoJobs extends short videos through a daemon with real workers (no reference needed):
// FramePack-Studio's "Video" (i2v) of a 30 fps video keeping its frames in front of the new ones,
// and "Video F1" of a 15 fps video without them; the video's last frames (a multiple of 4) are
// encoded, the first of them is SigLIP's image, the output holds the right frames; a video the
// job cannot use is refused at submit with the reason, and a finished job's video can be
// extended by its id.
func TestVideoJobs(t *testing.T) {
	if _, err := exec.LookPath("ffprobe"); err != nil {
		t.Skip("no ffprobe (make setup installs ffmpeg)")
	}
	fx := parity.Load(t, "pipeline")
	workers := buildWorkers(t)
	var jc i2vCase
	for _, c := range fx.Cases {
		if c.Op == opI2V {
			jc = loadCase(t, c)
			break
		}
	}
	img := jc.c.Input(t, "image_hwc_u8")
	h, w := int(img.Shape[0]), int(img.Shape[1])
	const n = 14 // 12 encoded: 3 latent frames
	frames := movingFrames(img, n)
	base := func(video []byte, variant string) i2vCase {
		c := jc
		c.spec = proto.Clone(jc.spec).(*framepackv1.JobSpec)
		c.spec.Variant, c.spec.InputVideo, c.image = variant, video, nil
		return c
	}

	// Video (backward) of a 30 fps video, its frames kept in front.
	vc := base(losslessVideo(t, frames, n, h, w, 30), "i2v")
	opts, job, _ := runParityJob(t, workers, vc)
	total := int(job.GetProgress().GetTotalSections())
	jf := openJobFiles(t, opts.State, job.GetId(), total)
	lat, shape := read(t, jf.cond, "video_latents")
	if shape[2] != 3 || len(lat) == 0 {
		t.Errorf("video latents %v, want 3 latent frames (the last 12 of 14 frames)", shape)
	}
	np, npShape := read(t, jf.cond, "image_np")
	in, inShape := read(t, jf.cond, "input_frames")
	if inShape[0] != n || inShape[1] != npShape[0] || inShape[2] != npShape[1] {
		t.Fatalf("input frames %v for image %v, want %d frames of its size", inShape, npShape, n)
	}
	// SigLIP's image is the first encoded frame: input frame 2 (of 14, the last 12 encoded).
	fb := int(npShape[0] * npShape[1] * 3)
	if d, k := parity.MaxAbsDiff(np, in[2*fb:3*fb]); d != 0 {
		t.Errorf("image_np is not the first encoded frame: max diff %v (%d values)", d, k)
	}
	_, _, gen := readHistory(t, jf.sections[total-1])
	want := n + (gen*4 - 3)
	if got := int(job.GetResult().GetFrameCount()); got != want {
		t.Errorf("%d frames, want %d input + %d generated", got, n, gen*4-3)
	}
	if got := ffprobeCount(t, job.GetResult().GetVideoPath()); got != want {
		t.Errorf("the MP4 holds %d frames, want %d", got, want)
	}

	// Video F1 of a 15 fps video, without its frames.
	f1 := base(losslessVideo(t, frames, n, h, w, 15), "f1")
	f1.spec.VideoIncludeInput = proto.Bool(false)
	_, job2, _ := runParityJob(t, workers, f1)
	if got, gen := int(job2.GetResult().GetFrameCount()), int(job2.GetProgress().GetTotalSections())*jc.window; got != gen*4-3 {
		t.Errorf("video F1 without the input: %d frames, want %d generated", got, gen*4-3)
	}

	// Refused at submit, with the reason.
	opts3 := newOpts(t, workers)
	d, err := newDaemon(opts3, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	cl := client(t, opts3.Socket)
	short := losslessVideo(t, frames, 2, h, w, 30)
	for _, tc := range []struct {
		name  string
		edit  func(r *framepackv1.SubmitJobRequest)
		field string
		want  string
	}{
		{"too short", func(r *framepackv1.SubmitJobRequest) { r.Spec.InputVideo = short }, "spec.input_video", "needs at least 4"},
		{"not a video", func(r *framepackv1.SubmitJobRequest) { r.Spec.InputVideo = []byte("not a video, not at all") }, "spec.input_video", "ffprobe cannot read it"},
		{"image too", func(r *framepackv1.SubmitJobRequest) { r.Image = jc.image }, "image", "takes no image"},
		{"f1 window", func(r *framepackv1.SubmitJobRequest) { r.Spec.Variant, r.Spec.LatentWindowSize = "f1", 9 }, "spec.input_video", "needs 9 (36 frames)"},
		{"keyframes", func(r *framepackv1.SubmitJobRequest) {
			r.Spec.Keyframes = []*framepackv1.Keyframe{{At: &framepackv1.Keyframe_Section{Section: 0}, Image: jc.image}}
		}, "spec.keyframes", "extends a video takes no keyframes"},
		{"no such job", func(r *framepackv1.SubmitJobRequest) { r.Spec.InputVideo, r.Spec.InputVideoJobId = nil, "nosuchjob00" }, "spec.input_video_job_id", "no job"},
	} {
		r := &framepackv1.SubmitJobRequest{Spec: proto.Clone(vc.spec).(*framepackv1.JobSpec)}
		tc.edit(r)
		_, err := cl.SubmitJob(t.Context(), r)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.field+": ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT on %s saying %q", tc.name, err, tc.field, tc.want)
		}
	}
	// A finished job's video, by its id, on the daemon that made it (still up).
	again := base(nil, "i2v")
	again.spec.InputVideoJobId = job.GetId()
	first := client(t, opts.Socket)
	resp, err := first.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Spec: again.spec})
	if err != nil {
		t.Fatalf("extend job %s by its id: %v", job.GetId(), err)
	}
	if s := resp.GetJob().GetSpec(); s.GetInputVideoJobId() != job.GetId() || len(s.GetInputVideoSha256()) != 64 {
		t.Errorf("extension of a job: stored spec %v", s)
	}
	_, _ = first.CancelJob(t.Context(), &framepackv1.CancelJobRequest{JobId: resp.GetJob().GetId()})
}

// ffprobeCount is the number of frames ffprobe counts in a video.
func ffprobeCount(t *testing.T, path string) int {
	t.Helper()
	out, err := exec.Command("ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries", "stream=nb_read_frames",
		"-of", "csv=p=0", path).Output()
	if err != nil {
		t.Fatalf("ffprobe %s: %v", path, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("ffprobe %s: %q", path, out)
	}
	return n
}
