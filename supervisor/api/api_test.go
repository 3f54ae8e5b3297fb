package api_test

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/apiaddr"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func baseSpec() *framepackv1.JobSpec {
	return &framepackv1.JobSpec{Prompt: "the girl dances gracefully", TotalSecondLength: 1, Steps: 3}
}

func kinds(evs []*framepackv1.JobEvent) []string {
	var out []string
	for _, ev := range evs {
		name := string(ev.ProtoReflect().WhichOneof(ev.ProtoReflect().Descriptor().Oneofs().ByName("event")).Name())
		out = append(out, name)
	}
	return out
}

func TestSubmitGetListWatch(t *testing.T) {
	if _, err := exec.LookPath("ffprobe"); err != nil {
		t.Skip("ffprobe not installed (make setup)")
	}
	dir := shortDir(t)
	r := newScript(-1)
	td := startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "s.sock"), []string{"cpu"}, r.Run)

	spec := baseSpec()
	spec.TotalSecondLength = 2.4 // 2 sections
	job := td.submit(t, spec)
	if job.GetState() != framepackv1.JobState_JOB_STATE_QUEUED || !jobs.ValidID(job.GetId()) {
		t.Fatalf("submitted %v", job)
	}
	// Defaults filled in.
	if s := job.GetSpec(); s.GetLatentWindowSize() != 9 || s.GetGs() != 10 || s.GetCfg() != 1 || s.GetResolution() != 640 || s.GetMp4Crf() != 16 || !s.GetUseTeacache() {
		t.Fatalf("spec with defaults %v", s)
	}
	evs := td.watchAll(t, job.GetId(), false)
	if evs[0].GetSnapshot().GetId() != job.GetId() {
		t.Fatalf("first event %v is not a snapshot", evs[0])
	}
	var steps, videos int
	for _, ev := range evs {
		if ev.GetJobId() != job.GetId() || ev.GetTime() == nil {
			t.Fatalf("event without job id or time: %v", ev)
		}
		if ev.GetPreview() != nil {
			t.Fatal("preview sent without include_previews")
		}
		if ev.GetSamplingStep() != nil {
			steps++
		}
		if v := ev.GetSectionVideo(); v != nil {
			videos++
			if _, err := os.Stat(v.GetPath()); err != nil {
				t.Fatalf("section video %s: %v", v.GetPath(), err)
			}
		}
	}
	if steps != 6 || videos != 2 || evs[len(evs)-1].GetJobFinished() == nil {
		t.Fatalf("events %v", kinds(evs))
	}

	got, err := td.jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: job.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	g := got.GetJob()
	if g.GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED || g.GetLane() != "cpu" || g.GetProgress().GetFraction() != 1 ||
		g.GetProgress().GetTotalSections() != 2 || g.GetResult().GetFrameCount() != 8 {
		t.Fatalf("finished job %v", g)
	}
	out, err := exec.Command("ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries", "stream=nb_read_frames,r_frame_rate,pix_fmt", "-of", "csv=p=0", g.GetResult().GetVideoPath()).Output()
	if err != nil || strings.TrimSpace(string(out)) != "yuv420p,30/1,8" {
		t.Fatalf("ffprobe of the result: %q %v", out, err)
	}

	// A second job, then the list: newest first, pages, state filter.
	second := td.submit(t, baseSpec())
	td.watchAll(t, second.GetId(), false)
	list, err := td.jobs.ListJobs(t.Context(), &framepackv1.ListJobsRequest{PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetJobs()) != 1 || list.GetJobs()[0].GetId() != second.GetId() || list.GetNextPageToken() == "" {
		t.Fatalf("first page %v", list)
	}
	list, err = td.jobs.ListJobs(t.Context(), &framepackv1.ListJobsRequest{PageSize: 1, PageToken: list.GetNextPageToken()})
	if err != nil || len(list.GetJobs()) != 1 || list.GetJobs()[0].GetId() != job.GetId() || list.GetNextPageToken() != "" {
		t.Fatalf("second page %v %v", list, err)
	}
	list, err = td.jobs.ListJobs(t.Context(), &framepackv1.ListJobsRequest{States: []framepackv1.JobState{framepackv1.JobState_JOB_STATE_RUNNING}})
	if err != nil || len(list.GetJobs()) != 0 {
		t.Fatalf("running jobs %v %v", list, err)
	}

	// Watching a finished job: snapshot, the whole history, the terminal event.
	again := td.watchAll(t, job.GetId(), false)
	if !slices.Equal(kinds(again)[1:], kinds(evs)[1:]) {
		t.Fatalf("replay of a finished job\n got %v\nwant %v", kinds(again), kinds(evs))
	}
	if again[0].GetSnapshot().GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("snapshot %v", again[0])
	}
}

func TestLateAttachReplaysHistory(t *testing.T) {
	dir := shortDir(t)
	r := newScript(0)
	td := startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "s.sock"), []string{"cpu"}, r.Run)
	spec := baseSpec()
	spec.TotalSecondLength = 2.4
	job := td.submit(t, spec)
	r.waitReached(t)

	// Attach after section 0: snapshot and history first, then (after the release) live.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	stream, err := td.jobs.WatchJob(ctx, &framepackv1.WatchJobRequest{JobId: job.GetId(), IncludePreviews: true})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := stream.Recv()
	if err != nil || snap.GetSnapshot().GetState() != framepackv1.JobState_JOB_STATE_RUNNING ||
		snap.GetSnapshot().GetProgress().GetLatestVideoPath() == "" {
		t.Fatalf("snapshot %v %v", snap, err)
	}
	var history []*framepackv1.JobEvent
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		history = append(history, ev)
		if ev.GetPreview() != nil { // the latest preview closes the history
			break
		}
	}
	want := []string{"stage_started", "stage_finished", "stage_started", "stage_finished", "stage_started", "stage_finished", "stage_started", "stage_finished",
		"stage_started", "sampling_step", "sampling_step", "sampling_step", "stage_finished", "section_video", "preview"}
	if !slices.Equal(kinds(history), want) {
		t.Fatalf("history\n got %v\nwant %v", kinds(history), want)
	}
	if p := history[len(history)-1].GetPreview(); p.GetStep() != 3 || p.GetSectionIndex() != 0 {
		t.Fatalf("latest preview %v", p)
	}
	close(r.release)
	var live []*framepackv1.JobEvent
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, ev)
		if isTerminal(ev) {
			break
		}
	}
	if live[0].GetStageStarted().GetSectionIndex() != 1 || live[len(live)-1].GetJobFinished() == nil {
		t.Fatalf("live %v", kinds(live))
	}
	if _, err := stream.Recv(); err == nil {
		t.Fatal("stream goes on after the terminal event")
	}
}

func violations(t *testing.T, err error) (codes.Code, []string, string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a status: %v", err)
	}
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, fv := range br.GetFieldViolations() {
				fields = append(fields, fv.GetField())
				if fv.GetDescription() == "" {
					t.Errorf("violation of %s without a description", fv.GetField())
				}
			}
		}
	}
	return st.Code(), fields, st.Message()
}

func TestSubmitValidation(t *testing.T) {
	dir := shortDir(t)
	r := newScript(-1)
	td := startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "s.sock"), []string{"cpu", "cuda:0"}, r.Run)
	img := pngImage(t, 40, 30)
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	with := func(f func(*framepackv1.JobSpec)) *framepackv1.JobSpec { s := baseSpec(); f(s); return s }
	for _, tc := range []struct {
		name  string
		image []byte
		spec  *framepackv1.JobSpec
		field string // "" means valid
	}{
		{name: "valid", spec: baseSpec()},
		{name: "valid bounds", spec: &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 120, LatentWindowSize: 33, Steps: 100, Cfg: 32, Gs: 1, Rs: 1,
			Resolution: 640, Mp4Crf: proto.Uint32(0), GpuMemoryPreservationGb: proto.Float32(0), UseTeacache: proto.Bool(false), Lane: "cuda:0", Seed: proto.Int64(math.MinInt64), ImageFilename: "start frame.png"}},
		{name: "valid upper bounds", spec: &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 0.01, LatentWindowSize: 1, Steps: 1, Cfg: 1, Gs: 32, Rs: 0,
			Mp4Crf: proto.Uint32(51), GpuMemoryPreservationGb: proto.Float32(128), NegativePrompt: strings.Repeat("n", api.MaxPromptBytes)}},
		{name: "no image", image: []byte{}, spec: baseSpec(), field: "image"},
		{name: "not an image", image: []byte("GIF89a not really"), spec: baseSpec(), field: "image"},
		{name: "truncated png", image: pngImage(t, 40, 30)[:60], spec: baseSpec(), field: "image"},
		{name: "too many pixels", image: pngHeaderOnly(8000, 6000), spec: baseSpec(), field: "image"},
		{name: "over 64 MiB", image: append(img, make([]byte, api.MaxImageBytes)...), spec: baseSpec(), field: "image"},
		{name: "no spec", field: "spec"},
		{name: "filename with slash", spec: with(func(s *framepackv1.JobSpec) { s.ImageFilename = "../x.png" }), field: "spec.image_filename"},
		{name: "filename too long", spec: with(func(s *framepackv1.JobSpec) { s.ImageFilename = strings.Repeat("a", 256) }), field: "spec.image_filename"},
		{name: "filename control char", spec: with(func(s *framepackv1.JobSpec) { s.ImageFilename = "a\nb.png" }), field: "spec.image_filename"},
		{name: "no prompt", spec: with(func(s *framepackv1.JobSpec) { s.Prompt = "" }), field: "spec.prompt"},
		{name: "blank prompt", spec: with(func(s *framepackv1.JobSpec) { s.Prompt = " \t\n" }), field: "spec.prompt"},
		{name: "prompt too long", spec: with(func(s *framepackv1.JobSpec) { s.Prompt = strings.Repeat("é", api.MaxPromptBytes/2+1) }), field: "spec.prompt"},
		{name: "negative prompt too long", spec: with(func(s *framepackv1.JobSpec) { s.NegativePrompt = strings.Repeat("n", api.MaxPromptBytes+1) }), field: "spec.negative_prompt"},
		{name: "no length", spec: with(func(s *framepackv1.JobSpec) { s.TotalSecondLength = 0 }), field: "spec.total_second_length"},
		{name: "negative length", spec: with(func(s *framepackv1.JobSpec) { s.TotalSecondLength = -1 }), field: "spec.total_second_length"},
		{name: "length over 120", spec: with(func(s *framepackv1.JobSpec) { s.TotalSecondLength = 120.5 }), field: "spec.total_second_length"},
		{name: "length NaN", spec: with(func(s *framepackv1.JobSpec) { s.TotalSecondLength = nan }), field: "spec.total_second_length"},
		{name: "length Inf", spec: with(func(s *framepackv1.JobSpec) { s.TotalSecondLength = inf }), field: "spec.total_second_length"},
		{name: "window 34", spec: with(func(s *framepackv1.JobSpec) { s.LatentWindowSize = 34 }), field: "spec.latent_window_size"},
		{name: "steps 101", spec: with(func(s *framepackv1.JobSpec) { s.Steps = 101 }), field: "spec.steps"},
		{name: "cfg below 1", spec: with(func(s *framepackv1.JobSpec) { s.Cfg = 0.5 }), field: "spec.cfg"},
		{name: "cfg negative", spec: with(func(s *framepackv1.JobSpec) { s.Cfg = -1 }), field: "spec.cfg"},
		{name: "cfg over 32", spec: with(func(s *framepackv1.JobSpec) { s.Cfg = 33 }), field: "spec.cfg"},
		{name: "cfg NaN", spec: with(func(s *framepackv1.JobSpec) { s.Cfg = nan }), field: "spec.cfg"},
		{name: "gs below 1", spec: with(func(s *framepackv1.JobSpec) { s.Gs = 0.5 }), field: "spec.gs"},
		{name: "gs over 32", spec: with(func(s *framepackv1.JobSpec) { s.Gs = 40 }), field: "spec.gs"},
		{name: "gs Inf", spec: with(func(s *framepackv1.JobSpec) { s.Gs = inf }), field: "spec.gs"},
		{name: "rs negative", spec: with(func(s *framepackv1.JobSpec) { s.Rs = -0.1 }), field: "spec.rs"},
		{name: "rs over 1", spec: with(func(s *framepackv1.JobSpec) { s.Rs = 1.5 }), field: "spec.rs"},
		{name: "rs NaN", spec: with(func(s *framepackv1.JobSpec) { s.Rs = nan }), field: "spec.rs"},
		{name: "resolution 512", spec: with(func(s *framepackv1.JobSpec) { s.Resolution = 512 }), field: "spec.resolution"},
		{name: "resolution 5000", spec: with(func(s *framepackv1.JobSpec) { s.Resolution = 5000 }), field: "spec.resolution"},
		{name: "crf 52", spec: with(func(s *framepackv1.JobSpec) { s.Mp4Crf = proto.Uint32(52) }), field: "spec.mp4_crf"},
		{name: "gpu preservation negative", spec: with(func(s *framepackv1.JobSpec) { s.GpuMemoryPreservationGb = proto.Float32(-1) }), field: "spec.gpu_memory_preservation_gb"},
		{name: "gpu preservation 129", spec: with(func(s *framepackv1.JobSpec) { s.GpuMemoryPreservationGb = proto.Float32(129) }), field: "spec.gpu_memory_preservation_gb"},
		{name: "gpu preservation NaN", spec: with(func(s *framepackv1.JobSpec) { s.GpuMemoryPreservationGb = proto.Float32(nan) }), field: "spec.gpu_memory_preservation_gb"},
		{name: "keep alive negative", spec: with(func(s *framepackv1.JobSpec) { s.KeepAlive = durationpb.New(-time.Second) }), field: "spec.keep_alive"},
		{name: "keep alive two days", spec: with(func(s *framepackv1.JobSpec) { s.KeepAlive = durationpb.New(48 * time.Hour) }), field: "spec.keep_alive"},
		{name: "unknown lane", spec: with(func(s *framepackv1.JobSpec) { s.Lane = "cuda:7" }), field: "spec.lane"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			image := tc.image
			if image == nil {
				image = img
			}
			resp, err := td.jobs.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: image, Spec: tc.spec})
			if tc.field == "" {
				if err != nil {
					t.Fatalf("valid request refused: %v", err)
				}
				if resp.GetJob().GetState() != framepackv1.JobState_JOB_STATE_QUEUED {
					t.Fatalf("job %v", resp.GetJob())
				}
				return
			}
			code, fields, msg := violations(t, err)
			if code != codes.InvalidArgument || !slices.Equal(fields, []string{tc.field}) || !strings.Contains(msg, tc.field+": ") {
				t.Fatalf("got %v %v %q, want INVALID_ARGUMENT for %s", code, fields, msg, tc.field)
			}
		})
	}

	// Every bad field is reported at once.
	bad := &framepackv1.JobSpec{Prompt: "", TotalSecondLength: 500, Steps: 1000, Cfg: 99, Rs: 2}
	_, err := td.jobs.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Spec: bad})
	code, fields, _ := violations(t, err)
	want := []string{"image", "spec.prompt", "spec.total_second_length", "spec.steps", "spec.cfg", "spec.rs"}
	if code != codes.InvalidArgument || !slices.Equal(fields, want) {
		t.Fatalf("got %v %v, want %v", code, fields, want)
	}

	// The other requests.
	for _, tc := range []struct {
		name  string
		call  func() error
		code  codes.Code
		field string
	}{
		{"get without id", func() error { _, err := td.jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{}); return err }, codes.InvalidArgument, "job_id"},
		{"get unknown", func() error {
			_, err := td.jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: "0000000000"})
			return err
		}, codes.NotFound, ""},
		{"get malformed id", func() error {
			_, err := td.jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: "../../etc"})
			return err
		}, codes.NotFound, ""},
		{"list page size", func() error {
			_, err := td.jobs.ListJobs(t.Context(), &framepackv1.ListJobsRequest{PageSize: 1001})
			return err
		}, codes.InvalidArgument, "page_size"},
		{"list bad token", func() error {
			_, err := td.jobs.ListJobs(t.Context(), &framepackv1.ListJobsRequest{PageToken: "nope"})
			return err
		}, codes.InvalidArgument, "page_token"},
		{"list bad state", func() error {
			_, err := td.jobs.ListJobs(t.Context(), &framepackv1.ListJobsRequest{States: []framepackv1.JobState{99}})
			return err
		}, codes.InvalidArgument, "states"},
		{"cancel without id", func() error {
			_, err := td.jobs.CancelJob(t.Context(), &framepackv1.CancelJobRequest{})
			return err
		}, codes.InvalidArgument, "job_id"},
		{"cancel long reason", func() error {
			_, err := td.jobs.CancelJob(t.Context(), &framepackv1.CancelJobRequest{JobId: "0000000000", Reason: strings.Repeat("r", api.MaxReasonBytes+1)})
			return err
		}, codes.InvalidArgument, "reason"},
		{"cancel unknown", func() error {
			_, err := td.jobs.CancelJob(t.Context(), &framepackv1.CancelJobRequest{JobId: "0000000000"})
			return err
		}, codes.NotFound, ""},
		{"watch unknown", func() error {
			s, err := td.jobs.WatchJob(t.Context(), &framepackv1.WatchJobRequest{JobId: "0000000000"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.NotFound, ""},
		{"watch without id", func() error {
			s, err := td.jobs.WatchJob(t.Context(), &framepackv1.WatchJobRequest{})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.InvalidArgument, "job_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, fields, msg := violations(t, tc.call())
			if code != tc.code {
				t.Fatalf("code %v (%s), want %v", code, msg, tc.code)
			}
			if tc.field != "" && !slices.Equal(fields, []string{tc.field}) {
				t.Fatalf("fields %v, want %s", fields, tc.field)
			}
		})
	}
}

func TestCancel(t *testing.T) {
	dir := shortDir(t)
	r := newScript(0)
	td := startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "s.sock"), []string{"cpu"}, r.Run)
	spec := baseSpec()
	spec.TotalSecondLength = 2.4
	running := td.submit(t, spec)
	r.waitReached(t)
	queued := td.submit(t, baseSpec())

	resp, err := td.jobs.CancelJob(t.Context(), &framepackv1.CancelJobRequest{JobId: queued.GetId(), Reason: "not needed"})
	if err != nil || resp.GetJob().GetState() != framepackv1.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("cancel queued %v %v", resp, err)
	}
	evs := td.watchAll(t, queued.GetId(), false)
	if len(evs) != 2 || evs[1].GetJobCancelled().GetReason() != "not needed" {
		t.Fatalf("queued job's stream %v", kinds(evs))
	}

	// A watcher attached to the running job sees the cancellation end its stream.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	stream, err := td.jobs.WatchJob(ctx, &framepackv1.WatchJobRequest{JobId: running.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // snapshot
		t.Fatal(err)
	}
	resp, err = td.jobs.CancelJob(t.Context(), &framepackv1.CancelJobRequest{JobId: running.GetId()})
	if err != nil || resp.GetJob().GetState() != framepackv1.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("cancel running %v %v", resp, err)
	}
	var last *framepackv1.JobEvent
	for {
		ev, err := stream.Recv()
		if err != nil {
			break
		}
		last = ev
	}
	if last.GetJobCancelled() == nil {
		t.Fatalf("stream ended with %v", last)
	}
	if err := <-r.returned; !errors.Is(err, jobs.ErrCancelled) {
		t.Fatalf("runner returned %v", err)
	}
	// Files stay consistent: the finished section's video and history are kept, nothing
	// half-written is left.
	d := td.d.Store().JobDir(running.GetId())
	waitFor(t, func() bool {
		_, err := os.Stat(filepath.Join(d.Videos(), "next.mp4.partial"))
		return os.IsNotExist(err)
	})
	if _, err := os.Stat(filepath.Join(d.Videos(), running.GetId()+"_4.mp4")); err != nil {
		t.Errorf("finished section's video: %v", err)
	}
	// Cancelling again returns the job unchanged.
	resp, err = td.jobs.CancelJob(t.Context(), &framepackv1.CancelJobRequest{JobId: running.GetId()})
	if err != nil || resp.GetJob().GetState() != framepackv1.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("cancel again %v %v", resp, err)
	}
}

// waitFor polls cond (for effects outside the API's events, such as files).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRestartResumesFromRecordedSection(t *testing.T) {
	for _, stop := range []string{"kill", "graceful"} {
		t.Run(stop, func(t *testing.T) {
			dir := shortDir(t)
			state, sock := filepath.Join(dir, "state"), filepath.Join(dir, "s.sock")
			first := newScript(1)
			td := startDaemon(t, state, sock, []string{"cpu"}, first.Run)
			spec := baseSpec()
			spec.TotalSecondLength = 5 // 4 sections
			job := td.submit(t, spec)
			first.waitReached(t)
			if stop == "kill" {
				td.kill()
			} else {
				td.conn.Close()
				if err := td.d.Stop(t.Context()); err != nil { // grace 1 s, then cancelled
					t.Fatal(err)
				}
			}
			if err := <-first.returned; !errors.Is(err, jobs.ErrShutdown) {
				t.Fatalf("first runner returned %v", err)
			}

			second := newScript(-1)
			td2 := startDaemon(t, state, sock, []string{"cpu"}, second.Run)
			evs := td2.watchAll(t, job.GetId(), false)
			if evs[len(evs)-1].GetJobFinished() == nil {
				t.Fatalf("job did not finish: %v", kinds(evs))
			}
			if len(second.resumes) != 1 || second.resumes[0] == nil || second.resumes[0].Section != 1 {
				t.Fatalf("second run's resume point %+v", second.resumes)
			}
			if got := append(first.sections, second.sections...); !slices.Equal(got, []int{0, 1, 2, 3}) {
				t.Fatalf("sections run %v", got)
			}
			// The stream replays the first run's events too: every section's video, in order.
			var videos []uint32
			for _, ev := range evs {
				if v := ev.GetSectionVideo(); v != nil {
					videos = append(videos, v.GetSectionIndex())
				}
			}
			if !slices.Equal(videos, []uint32{0, 1, 2, 3}) {
				t.Fatalf("section videos %v", videos)
			}
			if res := evs[len(evs)-1].GetJobFinished().GetResult(); res.GetFrameCount() != 16 {
				t.Fatalf("result %v", res)
			}
			if _, err := os.Stat(filepath.Join(td2.d.Store().JobDir(job.GetId()).Videos(), "next.mp4.partial")); !os.IsNotExist(err) {
				t.Errorf("partial output of the interrupted run kept: %v", err)
			}
		})
	}
}

func TestHealthReflectionDevicesSocket(t *testing.T) {
	dir := shortDir(t)
	r := newScript(0)
	sock := filepath.Join(dir, "s.sock")
	td := startDaemon(t, filepath.Join(dir, "state"), sock, []string{"cuda:1", "cpu"}, r.Run)

	st, err := os.Stat(sock)
	if err != nil || st.Mode().Perm() != 0o600 || st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v %v", st.Mode(), err)
	}
	hc := healthpb.NewHealthClient(td.conn)
	for _, svc := range append([]string{""}, api.ServiceNames...) {
		resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v %v", svc, resp, err)
		}
	}
	rctx, rcancel := context.WithCancel(t.Context())
	defer rcancel()
	rc, err := reflectionpb.NewServerReflectionClient(td.conn).ServerReflectionInfo(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	rcancel()
	var services []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	for _, want := range []string{"framepack.v1.JobService", "framepack.v1.DeviceService", "grpc.health.v1.Health"} {
		if !slices.Contains(services, want) {
			t.Errorf("reflection lists %v, missing %s", services, want)
		}
	}

	job := td.submit(t, baseSpec())
	r.waitReached(t)
	devs, err := td.devs.ListDevices(t.Context(), &framepackv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(devs.GetDevices()) != 2 || devs.GetDevices()[0].GetLane() != "cpu" || devs.GetDevices()[1].GetBackend() != "cuda" ||
		devs.GetDevices()[0].GetCurrentJobId()+devs.GetDevices()[1].GetCurrentJobId() != job.GetId() {
		t.Fatalf("devices %v", devs)
	}

	// One daemon per socket and per state directory.
	if _, err := api.StartDaemon(api.DaemonConfig{StateDir: filepath.Join(dir, "other"), Listen: []api.Addr{{Network: "unix", Address: sock}}, Lanes: []string{"cpu"}, Run: r.Run}); !errors.Is(err, api.ErrAddrInUse) {
		t.Fatalf("second daemon on the socket: %v", err)
	}
	if _, err := api.StartDaemon(api.DaemonConfig{StateDir: filepath.Join(dir, "state"), Listen: []api.Addr{{Network: "unix", Address: filepath.Join(dir, "t.sock")}}, Lanes: []string{"cpu"}, Run: r.Run}); !errors.Is(err, jobs.ErrLocked) {
		t.Fatalf("second daemon on the state dir: %v", err)
	}
	close(r.release)

	// Graceful stop: health goes NOT_SERVING and watch streams end.
	stream, err := td.jobs.WatchJob(t.Context(), &framepackv1.WatchJobRequest{JobId: job.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if isTerminal(ev) {
			break
		}
	}
	if err := td.d.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after stop: %v", err)
	}
}

func TestTCPListener(t *testing.T) {
	dir := shortDir(t)
	r := newScript(-1)
	d, err := api.StartDaemon(api.DaemonConfig{
		StateDir: filepath.Join(dir, "state"),
		Listen:   []api.Addr{{Network: "unix", Address: filepath.Join(dir, "s.sock")}, {Network: "tcp", Address: "127.0.0.1:0"}},
		Lanes:    []string{"cpu"}, Run: r.Run,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	tcp := d.Addrs()[1].String()
	a, err := apiaddr.ParseAddr("tcp://" + tcp)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(a.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := framepackv1.NewJobServiceClient(conn).ListJobs(t.Context(), &framepackv1.ListJobsRequest{})
	if err != nil || len(resp.GetJobs()) != 0 {
		t.Fatalf("list over tcp: %v %v", resp, err)
	}
}
