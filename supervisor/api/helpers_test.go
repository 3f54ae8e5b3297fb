package api_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/video"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// shortDir returns a temporary directory with a short path: unix socket paths are limited to
// 107 bytes, and t.TempDir() paths carry the test's name.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "fpk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func pngImage(t testing.TB, w, h int) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.NRGBA{uint8(x * 7), uint8(y * 5), 90, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// pngHeaderOnly is the start of a PNG that declares w×h pixels and then ends: enough for a
// decoder to refuse it by its size before reading pixel data.
func pngHeaderOnly(w, h uint32) []byte {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = 8, 2 // 8-bit RGB
	chunk := append([]byte("IHDR"), ihdr...)
	binary.Write(&b, binary.BigEndian, uint32(len(ihdr)))
	b.Write(chunk)
	binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(chunk))
	return b.Bytes()
}

// testDaemon is a daemon on a unix socket in a short temporary directory, and a client.
type testDaemon struct {
	d      *api.Daemon
	socket string
	conn   *grpc.ClientConn
	jobs   framepackv1.JobServiceClient
	devs   framepackv1.DeviceServiceClient
}

// startDaemon starts a daemon on socket; opts change its config (Ready, …) before it starts.
func startDaemon(t *testing.T, state, socket string, lanes []string, run func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error), opts ...func(*api.DaemonConfig)) *testDaemon {
	t.Helper()
	cfg := api.DaemonConfig{
		StateDir: state,
		Listen:   []api.Addr{{Network: "unix", Address: socket}},
		Lanes:    lanes,
		Run:      run,
		Grace:    time.Second,
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	d, err := api.StartDaemon(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(api.Addr{Network: "unix", Address: socket}.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	td := &testDaemon{d: d, socket: socket, conn: conn, jobs: framepackv1.NewJobServiceClient(conn), devs: framepackv1.NewDeviceServiceClient(conn)}
	t.Cleanup(td.kill)
	return td
}

func (td *testDaemon) kill() {
	td.conn.Close()
	td.d.Kill()
}

func (td *testDaemon) submit(t *testing.T, spec *framepackv1.JobSpec) *framepackv1.Job {
	t.Helper()
	resp, err := td.jobs.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: pngImage(t, 40, 30), Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetJob()
}

// watchAll watches job id to its end and returns every event.
func (td *testDaemon) watchAll(t *testing.T, id string, previews bool) []*framepackv1.JobEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := td.jobs.WatchJob(ctx, &framepackv1.WatchJobRequest{JobId: id, IncludePreviews: previews})
	if err != nil {
		t.Fatal(err)
	}
	var evs []*framepackv1.JobEvent
	for {
		ev, err := stream.Recv()
		if err != nil {
			if len(evs) > 0 && isTerminal(evs[len(evs)-1]) {
				return evs
			}
			t.Fatalf("watch %s: %v after %d events", id, err, len(evs))
		}
		evs = append(evs, ev)
	}
}

func isTerminal(ev *framepackv1.JobEvent) bool {
	return ev.GetJobFinished() != nil || ev.GetJobFailed() != nil || ev.GetJobCancelled() != nil
}

// scriptRunner is a fake Runner that goes through a job's sections the way the pipeline will:
// stage and step events, a real MP4 per section (supervisor/video), history file, checkpoint,
// section_video. It can block after a section until released or cancelled.
type scriptRunner struct {
	blockAfter int           // section after which to block; -1 never
	release    chan struct{} // closed to let a blocked job go on
	reached    chan string   // job id, sent when blocked
	returned   chan error    // what Run returned
	mu         sync.Mutex
	resumes    []*jobs.Checkpoint
	sections   []int
}

func newScript(blockAfter int) *scriptRunner {
	return &scriptRunner{blockAfter: blockAfter, release: make(chan struct{}), reached: make(chan string, 8), returned: make(chan error, 8)}
}

func (r *scriptRunner) Run(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (res jobs.Result, err error) {
	defer func() { r.returned <- err }()
	r.mu.Lock()
	r.resumes = append(r.resumes, job.Resume)
	r.mu.Unlock()
	start := 0
	if job.Resume != nil {
		start = job.Resume.Section + 1
	} else {
		for _, st := range []framepackv1.Stage{framepackv1.Stage_STAGE_TEXT_ENCODE, framepackv1.Stage_STAGE_PREPARE, framepackv1.Stage_STAGE_VAE_ENCODE, framepackv1.Stage_STAGE_IMAGE_ENCODE} {
			emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: st, Attempt: 1, Lane: job.Lane}}})
			emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageFinished{StageFinished: &framepackv1.StageFinished{Stage: st, Attempt: 1, Duration: durationpb.New(time.Millisecond)}}})
		}
	}
	steps := job.Spec.GetSteps()
	var out video.Output
	var w video.Writer
	for s := start; s < job.TotalSections; s++ {
		emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TRANSFORMER, SectionIndex: uint32(s), Attempt: 1}}})
		for i := uint32(1); i <= steps; i++ {
			if err := ctx.Err(); err != nil {
				return jobs.Result{}, context.Cause(ctx)
			}
			emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{SectionIndex: uint32(s), Step: i, TotalSteps: steps, Eta: durationpb.New(time.Second)}}})
			emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_Preview{Preview: &framepackv1.Preview{SectionIndex: uint32(s), Step: i, Png: []byte("png")}}})
		}
		emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageFinished{StageFinished: &framepackv1.StageFinished{Stage: framepackv1.Stage_STAGE_TRANSFORMER, SectionIndex: uint32(s), Attempt: 1}}})
		frames := 4 * (s + 1)
		clip := video.Clip{Frames: frames, Height: 16, Width: 24, RGB: bytes.Repeat([]byte{byte(40 * s), 128, 200}, frames*16*24)}
		out, err = w.Write(ctx, filepath.Join(job.Dir.Videos(), fmt.Sprintf("%s_%d.mp4", job.ID, frames)), clip, int(job.Spec.GetMp4Crf()))
		if err != nil {
			return jobs.Result{}, err
		}
		hist := filepath.Join("history", fmt.Sprintf("section-%d.safetensors", s))
		if err := os.WriteFile(filepath.Join(job.Dir.Path(), hist), []byte{byte(s)}, 0o644); err != nil {
			return jobs.Result{}, err
		}
		if err := job.SaveCheckpoint(jobs.Checkpoint{Section: s, Sections: job.TotalSections, Files: map[string]string{"history": hist}, VideoPath: out.Path, FrameCount: frames}); err != nil {
			return jobs.Result{}, err
		}
		emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SectionVideo{SectionVideo: &framepackv1.SectionVideo{SectionIndex: uint32(s), Path: out.Path, FrameCount: uint32(frames)}}})
		r.mu.Lock()
		r.sections = append(r.sections, s)
		r.mu.Unlock()
		if s == r.blockAfter {
			r.reached <- job.ID
			select {
			case <-r.release:
			case <-ctx.Done():
				// Half-written output of the next stage, as a killed worker leaves it.
				_ = os.WriteFile(filepath.Join(job.Dir.Videos(), "next.mp4.partial"), []byte("x"), 0o644)
				return jobs.Result{}, context.Cause(ctx)
			}
		}
	}
	return jobs.Result{VideoPath: out.Path, FrameCount: out.Frames, PNGFrames: out.Format == video.FormatPNG}, nil
}

func (r *scriptRunner) waitReached(t *testing.T) string {
	t.Helper()
	select {
	case id := <-r.reached:
		return id
	case <-time.After(20 * time.Second):
		t.Fatal("runner never reached its block")
		return ""
	}
}
