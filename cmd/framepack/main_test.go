package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/testbin"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/video"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// fakeRunner stands in for the pipeline below the process boundary. The prompt says what to
// do: "fail …" fails, "block …" runs until cancelled, "nofffmpeg …" writes its video with no
// ffmpeg (PNG frames); anything else makes one real MP4 per section.
func fakeRunner(blocked chan<- string) func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error) {
	return fakeRunnerBlocking(blocked, true)
}

// fakeRunnerBlocking is fakeRunner; with block false, "block" prompts run like any other.
func fakeRunnerBlocking(blocked chan<- string, block bool) func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error) {
	return func(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error) {
		prompt := job.Spec.GetPrompt()
		emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TEXT_ENCODE, Attempt: 1}}})
		switch {
		case strings.HasPrefix(prompt, "fail"):
			return jobs.Result{}, &jobs.FailureError{Failure: &framepackv1.JobFailure{Message: "vae decode gave up", Stage: framepackv1.Stage_STAGE_VAE_DECODE,
				Attempts: []*framepackv1.Attempt{{Stage: framepackv1.Stage_STAGE_VAE_DECODE, Attempt: 1, Class: framepackv1.AttemptClass_ATTEMPT_CLASS_OOM, Message: "out of memory", Change: "vae tile 256 -> 128 px"}}}}
		case strings.HasPrefix(prompt, "block") && block:
			blocked <- job.ID
			<-ctx.Done()
			return jobs.Result{}, context.Cause(ctx)
		}
		w := video.Writer{}
		if strings.HasPrefix(prompt, "noffmpeg") {
			w.FFmpeg = "/nonexistent/ffmpeg"
		}
		var out video.Output
		for s := 0; s < job.TotalSections; s++ {
			emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TRANSFORMER, SectionIndex: uint32(s), Attempt: 1}}})
			for i := uint32(1); i <= job.Spec.GetSteps(); i++ {
				emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{SectionIndex: uint32(s), Step: i, TotalSteps: job.Spec.GetSteps(), Eta: durationpb.New(time.Second)}}})
				emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_Preview{Preview: &framepackv1.Preview{SectionIndex: uint32(s), Step: i, Png: []byte("\x89PNG fake")}}})
			}
			frames := 3 * (s + 1)
			clip := video.Clip{Frames: frames, Height: 16, Width: 32, RGB: bytes.Repeat([]byte{200, 100, byte(50 * s)}, frames*16*32)}
			var err error
			out, err = w.Write(ctx, filepath.Join(job.Dir.Videos(), fmt.Sprintf("%s_%d.mp4", job.ID, frames)), clip, int(job.Spec.GetMp4Crf()))
			if err != nil {
				return jobs.Result{}, err
			}
			emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SectionVideo{SectionVideo: &framepackv1.SectionVideo{SectionIndex: uint32(s), Path: out.Path, FrameCount: uint32(frames)}}})
		}
		return jobs.Result{VideoPath: out.Path, FrameCount: out.Frames, PNGFrames: out.Format == video.FormatPNG}, nil
	}
}

type fixture struct {
	bin     string
	addr    string
	dir     string
	image   string
	blocked chan string
	d       *api.Daemon
}

// waitBlocked returns the id of the next job whose fake run blocked, failing the test after a
// minute (a job left running by a failed subtest holds the lane; waiting forever would hide
// that failure behind the suite's timeout).
func (f *fixture) waitBlocked(t *testing.T) string {
	t.Helper()
	select {
	case id := <-f.blocked:
		return id
	case <-time.After(time.Minute):
		t.Fatal("no job's run started within a minute (is an earlier job still holding the lane?)")
		return ""
	}
}

// restart kills the daemon and starts another on its state directory and socket, whose fake
// runs do not block; opts are its gRPC server options.
func (f *fixture) restart(t *testing.T, opts ...grpc.ServerOption) {
	t.Helper()
	f.d.Kill()
	d, err := api.StartDaemon(api.DaemonConfig{
		StateDir:      filepath.Join(f.dir, "state"),
		Listen:        []api.Addr{{Network: "unix", Address: f.addr}},
		Lanes:         []string{"cpu"},
		Run:           fakeRunnerBlocking(f.blocked, false),
		ServerOptions: opts,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.d = d
}

func setup(t *testing.T) *fixture {
	t.Helper()
	return setupWith(t, nil)
}

// setupWith is setup with the daemon's configuration changed by mod (nil: as setup).
func setupWith(t *testing.T, mod func(*api.DaemonConfig)) *fixture {
	t.Helper()
	bin := testbin.Build(t, "./cmd/framepack")
	dir, err := os.MkdirTemp("", "fpkcli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fixture{bin: bin, dir: dir, addr: filepath.Join(dir, "d.sock"), blocked: make(chan string, 4)}
	cfg := api.DaemonConfig{
		StateDir: filepath.Join(dir, "state"),
		Listen:   []api.Addr{{Network: "unix", Address: f.addr}},
		Lanes:    []string{"cpu"},
		Run:      fakeRunner(f.blocked),
		Grace:    time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	f.d, err = api.StartDaemon(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.d.Kill() }) // f.d may be replaced by a restart
	img := image.NewNRGBA(image.Rect(0, 0, 48, 32))
	for i := range img.Pix {
		img.Pix[i] = byte(i)
	}
	img.Set(0, 0, color.NRGBA{1, 2, 3, 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	f.image = filepath.Join(dir, "start.png")
	if err := os.WriteFile(f.image, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

type result struct {
	code           int
	stdout, stderr string
}

// cli runs the built binary with args (and --addr) and returns its exit status and output.
func (f *fixture) cli(t *testing.T, args ...string) result {
	t.Helper()
	return runResult(t, f.command(t, args...), args)
}

// runResult runs cmd (the binary with args) and returns its exit status and output; only a
// failure to start it fails the test.
func runResult(t *testing.T, cmd *exec.Cmd, args []string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %v: %v", args, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

func (f *fixture) command(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, f.bin, args...)
	cmd.Env = append(os.Environ(), "FRAMEPACK_ADDR="+f.addr)
	return cmd
}

func ffprobeFrames(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0",
		"-show_entries", "stream=nb_read_frames,width,height,r_frame_rate,pix_fmt", "-of", "csv=p=0", path).Output()
	if err != nil {
		t.Fatalf("ffprobe %s: %v", path, err)
	}
	return strings.TrimSpace(string(out))
}

func TestCLI(t *testing.T) {
	if _, err := exec.LookPath("ffprobe"); err != nil {
		t.Skip("ffprobe not installed (make setup)")
	}
	f := setup(t)

	t.Run("generate", func(t *testing.T) {
		out := filepath.Join(f.dir, "out.mp4")
		r := f.cli(t, "generate", "--image", f.image, "--prompt", "a cat walks", "--seconds", "2.4", "--steps", "4", "--crf", "20", "--out", out)
		if r.code != exitOK || strings.TrimSpace(r.stdout) != out {
			t.Fatalf("exit %d, stdout %q, stderr:\n%s", r.code, r.stdout, r.stderr)
		}
		// Not a terminal: plain lines, one per stage and section, steps at the end of a section.
		for _, want := range []string{"queued (2 sections at resolution 640)", "section 1/2: transformer started", "section 2/2: step 4/4, 100% done",
			"section 1/2: video so far: 3 frames (download: framepack get ", "finished:"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
			}
		}
		if strings.Contains(r.stderr, "\r") {
			t.Error("carriage returns in plain output")
		}
		if got := ffprobeFrames(t, out); got != "32,16,yuv420p,30/1,6" {
			t.Fatalf("ffprobe of %s: %s", out, got)
		}
	})

	t.Run("generate with loras, a timed prompt and a variant refused", func(t *testing.T) {
		lora := filepath.Join(f.dir, "missing-lora.safetensors")
		r := f.cli(t, "generate", "--image", f.image, "--prompt", "[0s: a cat] [1,5s: jumps]", "--lora", lora+":0.7",
			"--variant", "f1", "--out", filepath.Join(f.dir, "x.mp4"))
		if r.code != exitRejected {
			t.Fatalf("exit %d, stderr %s", r.code, r.stderr)
		}
		for _, want := range []string{"--prompt (spec.prompt): timed prompt: position 14", "--lora (spec.loras[0].path)", lora,
			"--variant (spec.variant): this server runs only the i2v variant"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
			}
		}
	})

	t.Run("generate with an end frame refused", func(t *testing.T) {
		bad := filepath.Join(f.dir, "end-notimage.png")
		if err := os.WriteFile(bad, []byte("hello"), 0o644); err != nil {
			t.Fatal(err)
		}
		if r := f.cli(t, "generate", "--image", f.image, "--prompt", "p", "--end-image", bad, "--out", filepath.Join(f.dir, "x.mp4")); r.code != exitRejected || !strings.Contains(r.stderr, bad+" is not a PNG, JPEG or WebP") {
			t.Fatalf("end image not an image: exit %d, %s", r.code, r.stderr)
		}
		if r := f.cli(t, "generate", "--image", f.image, "--prompt", "p", "--end-strength", "0.5", "--out", filepath.Join(f.dir, "x.mp4")); r.code != exitUsage || !strings.Contains(r.stderr, "--end-strength needs --end-image") {
			t.Fatalf("strength without image: exit %d, %s", r.code, r.stderr)
		}
		r := f.cli(t, "generate", "--image", f.image, "--prompt", "p", "--end-image", f.image, "--end-strength", "1.5", "--variant", "f1", "--out", filepath.Join(f.dir, "x.mp4"))
		if r.code != exitRejected {
			t.Fatalf("exit %d, stderr %s", r.code, r.stderr)
		}
		for _, want := range []string{"--end-strength (spec.end_strength): must be a number from 0 to 1", "--end-image (spec.end_image): the f1 variant has no end frame"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
			}
		}
	})

	t.Run("generate refused", func(t *testing.T) {
		r := f.cli(t, "generate", "--image", f.image, "--prompt", " ", "--steps", "101", "--gs", "40", "--out", filepath.Join(f.dir, "x.mp4"))
		if r.code != exitRejected {
			t.Fatalf("exit %d, stderr %s", r.code, r.stderr)
		}
		for _, want := range []string{"the server refused the request:", "--prompt (spec.prompt): required", "--steps (spec.steps): must be 1 to 100", "--gs (spec.gs): must be 1 to 32"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
			}
		}
		bad := filepath.Join(f.dir, "notimage.png")
		os.WriteFile(bad, []byte("hello"), 0o644)
		if r := f.cli(t, "generate", "--image", bad, "--prompt", "p", "--out", filepath.Join(f.dir, "x.mp4")); r.code != exitRejected || !strings.Contains(r.stderr, "not a PNG, JPEG or WebP") {
			t.Fatalf("not an image: exit %d, %s", r.code, r.stderr)
		}
	})

	t.Run("failed job", func(t *testing.T) {
		r := f.cli(t, "generate", "--image", f.image, "--prompt", "fail please", "--out", filepath.Join(f.dir, "x.mp4"))
		if r.code != exitFailed || !strings.Contains(r.stderr, "vae decode gave up (stage vae decode, section 1)") ||
			!strings.Contains(r.stderr, "attempt 1 of vae decode: oom: out of memory; then vae tile 256 -> 128 px") {
			t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
		}
	})

	t.Run("no ffmpeg on the server", func(t *testing.T) {
		out := filepath.Join(f.dir, "frames.mp4")
		r := f.cli(t, "generate", "--image", f.image, "--prompt", "noffmpeg", "--seconds", "1", "--steps", "1", "--out", out)
		frames := filepath.Join(f.dir, "frames.frames")
		if r.code != exitPNGFrames || strings.TrimSpace(r.stdout) != frames || !strings.Contains(r.stderr, "no ffmpeg") {
			t.Fatalf("exit %d, stdout %q, stderr:\n%s", r.code, r.stdout, r.stderr)
		}
		entries, err := os.ReadDir(frames)
		if err != nil || len(entries) != 3 || entries[0].Name() != "000000.png" {
			t.Fatalf("frames %v %v", entries, err)
		}
	})

	t.Run("cancel watch jobs", func(t *testing.T) {
		r := f.cli(t, "generate", "--image", f.image, "--prompt", "block here", "--detach")
		id := strings.TrimSpace(r.stdout)
		if r.code != exitOK || !jobs.ValidID(id) {
			t.Fatalf("detach: exit %d, %q %s", r.code, r.stdout, r.stderr)
		}
		f.waitBlocked(t)
		watch := f.command(t, "watch", id, "--previews", filepath.Join(f.dir, "previews"))
		var wout, werr bytes.Buffer
		watch.Stdout, watch.Stderr = &wout, &werr
		if err := watch.Start(); err != nil {
			t.Fatal(err)
		}
		r = f.cli(t, "jobs", "--state", "running")
		if r.code != exitOK || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "running") {
			t.Fatalf("jobs: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		r = f.cli(t, "cancel", id, "--reason", "enough")
		if r.code != exitOK || !strings.Contains(r.stdout, "cancelled") {
			t.Fatalf("cancel: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		err := watch.Wait()
		if code := watch.ProcessState.ExitCode(); code != exitCancelled || !strings.Contains(werr.String(), "cancelled: enough") {
			t.Fatalf("watch: exit %d (%v), stderr:\n%s", code, err, werr.String())
		}
		r = f.cli(t, "cancel", id)
		if r.code != exitOK || !strings.Contains(r.stdout, "already ended: cancelled") {
			t.Fatalf("cancel again: %d %s", r.code, r.stdout)
		}
		r = f.cli(t, "jobs", "--limit", "0")
		if r.code != exitOK || strings.Count(r.stdout, "\n") != 5 || !strings.HasPrefix(r.stdout, "ID") {
			t.Fatalf("all jobs: exit %d\n%s", r.code, r.stdout)
		}
		for _, want := range []string{"succeeded", "failed", "cancelled", "block here", "a cat walks"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("jobs output lacks %q:\n%s", want, r.stdout)
			}
		}
	})

	t.Run("watch a finished job", func(t *testing.T) {
		r := f.cli(t, "generate", "--image", f.image, "--prompt", "x", "--seconds", "1", "--steps", "2", "--detach")
		id := strings.TrimSpace(r.stdout)
		out := filepath.Join(f.dir, "watched.mp4")
		prev := filepath.Join(f.dir, "prev")
		r = f.cli(t, "watch", id, "--out", out, "--previews", prev)
		if r.code != exitOK || strings.TrimSpace(r.stdout) != out {
			t.Fatalf("watch: exit %d %q\n%s", r.code, r.stdout, r.stderr)
		}
		if got := ffprobeFrames(t, out); !strings.HasSuffix(got, ",3") {
			t.Fatalf("ffprobe %s", got)
		}
		if r := f.cli(t, "watch", "zzzzzzzzzz"); r.code != exitNotFound {
			t.Fatalf("watch unknown: %d %s", r.code, r.stderr)
		}
	})

	t.Run("ctrl-c cancels", func(t *testing.T) {
		cmd := f.command(t, "generate", "--image", f.image, "--prompt", "block again", "--out", filepath.Join(f.dir, "never.mp4"))
		stderr := &watchedBuffer{want: "queued", seen: make(chan struct{})}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		id := f.waitBlocked(t)
		// Ctrl-C cancels the job the CLI knows: wait until it has its SubmitJob answer (the run
		// can start before the answer reaches the CLI)
		stderr.wait(t)
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		if code := cmd.ProcessState.ExitCode(); code != exitCancelled || !strings.Contains(stderr.String(), "interrupted from the command line") {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
		}
		job, err := f.d.Store().Get(id)
		if err != nil || job.GetState() != framepackv1.JobState_JOB_STATE_CANCELLED {
			t.Fatalf("job after ctrl-c: %v %v", job, err)
		}
	})

	t.Run("daemon restarts while generating", func(t *testing.T) {
		out := filepath.Join(f.dir, "restarted.mp4")
		cmd := f.command(t, "generate", "--image", f.image, "--prompt", "block until restart", "--seconds", "1", "--steps", "2", "--out", out)
		var stdout bytes.Buffer
		stderr := &watchedBuffer{want: "text encode started", seen: make(chan struct{})}
		cmd.Stdout, cmd.Stderr = &stdout, stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		f.waitBlocked(t)
		// the restart is the watch's to survive: wait until the CLI shows an event of its
		// stream (after "queued" it may not have opened the stream yet, and a WatchJob made
		// while the daemon restarts waits for the new one: no lost connection to report)
		stderr.wait(t)
		f.restart(t)
		cmd.Wait()
		if code := cmd.ProcessState.ExitCode(); code != exitOK || strings.TrimSpace(stdout.String()) != out ||
			!strings.Contains(stderr.String(), "connection to the server lost; reconnecting") {
			t.Fatalf("exit %d, stdout %q, stderr:\n%s", code, stdout.String(), stderr.String())
		}
		if got := ffprobeFrames(t, out); !strings.HasSuffix(got, ",3") {
			t.Fatalf("ffprobe %s", got)
		}
	})

	t.Run("daemon dies before the SubmitJob answer arrives", func(t *testing.T) {
		// A daemon that stores the job and then loses the answer: its first SubmitJob
		// handler holds the answer until the connection is gone, which the test makes so by
		// killing the daemon. The CLI must send the request again (the same
		// client_request_id) to the restarted daemon, get the stored job and follow it.
		stored := make(chan string, 1)
		var first sync.Once
		loseAnswer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			resp, err := handler(ctx, req)
			if info.FullMethod != framepackv1.JobService_SubmitJob_FullMethodName || err != nil {
				return resp, err
			}
			lose := false
			first.Do(func() { lose = true })
			if !lose {
				return resp, err
			}
			stored <- resp.(*framepackv1.SubmitJobResponse).GetJob().GetId()
			<-ctx.Done()
			return nil, status.Error(codes.Unavailable, "the daemon died before answering")
		})
		f.restart(t, loseAnswer)

		out := filepath.Join(f.dir, "answer-lost.mp4")
		const prompt = "answer lost after the job was stored"
		cmd := f.command(t, "generate", "--image", f.image, "--prompt", prompt, "--seconds", "1", "--steps", "2", "--out", out)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var id string
		select {
		case id = <-stored:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the daemon never stored the job:\n%s", stderr.String())
		}
		f.restart(t)
		cmd.Wait()
		if code := cmd.ProcessState.ExitCode(); code != exitOK || strings.TrimSpace(stdout.String()) != out ||
			!strings.Contains(stderr.String(), "connection to the server lost; reconnecting") ||
			!strings.Contains(stderr.String(), "job "+id+" queued") {
			t.Fatalf("exit %d, stdout %q, stderr (want job %s):\n%s", code, stdout.String(), id, stderr.String())
		}
		list, _, err := f.d.Store().List(jobsAll())
		if err != nil {
			t.Fatal(err)
		}
		var made []string
		for _, job := range list {
			if job.GetSpec().GetPrompt() == prompt {
				made = append(made, job.GetId())
			}
		}
		if len(made) != 1 || made[0] != id {
			t.Fatalf("jobs made for the request %v, want only %s", made, id)
		}
		if got := ffprobeFrames(t, out); !strings.HasSuffix(got, ",3") {
			t.Fatalf("ffprobe %s", got)
		}
	})

	t.Run("devices", func(t *testing.T) {
		r := f.cli(t, "devices")
		if r.code != exitOK || !strings.Contains(r.stdout, "LANE") || !strings.Contains(r.stdout, "cpu ") {
			t.Fatalf("devices: %d\n%s%s", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("usage and reachability", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			code int
			want string
		}{
			{nil, exitUsage, "usage: framepack [--addr ADDR] [--timeout D] COMMAND"},
			{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
			{[]string{"generate", "--image", "x.png"}, exitUsage, "required"},
			{[]string{"generate", "--steps", "many"}, exitUsage, "invalid value"},
			{[]string{"watch"}, exitUsage, "want one job id"},
			{[]string{"jobs", "--state", "sleeping"}, exitUsage, "--state"},
			{[]string{"devices", "--addr", "http://x"}, exitUsage, "--addr"},
			{[]string{"devices", "--addr", filepath.Join(f.dir, "nobody.sock")}, exitUnreachable, "cannot reach the server"},
			{[]string{"cancel", "zzzzzzzzzz"}, exitNotFound, "no job"},
			{[]string{"generate", "--image", filepath.Join(f.dir, "missing.png"), "--prompt", "p", "--out", "o.mp4"}, exitError, "read image"},
		} {
			r := f.cli(t, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
			}
		}
		if r := f.cli(t, "help"); r.code != exitOK || !strings.Contains(r.stdout, "commands:") {
			t.Errorf("help: %d %s", r.code, r.stdout)
		}
	})
}

// watchedBuffer is a process's output buffer that closes seen once the output contains want.
type watchedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	done bool
}

func (w *watchedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.seen)
	}
	return n, err
}

// wait returns once the output contains want, failing the test after 30 s.
func (w *watchedBuffer) wait(t *testing.T) {
	t.Helper()
	select {
	case <-w.seen:
	case <-time.After(30 * time.Second):
		t.Fatalf("the CLI never wrote %q:\n%s", w.want, w.String())
	}
}

func (w *watchedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
