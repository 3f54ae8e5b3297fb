package api_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// videoRunner writes a 64 KiB "video" per job.
func videoRunner(_ context.Context, job *jobs.Job, _ func(*framepackv1.JobEvent)) (jobs.Result, error) {
	p := filepath.Join(job.Dir.Videos(), job.ID+".mp4")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return jobs.Result{}, err
	}
	if err := os.WriteFile(p, make([]byte, 64<<10), 0o644); err != nil {
		return jobs.Result{}, err
	}
	return jobs.Result{VideoPath: p, FrameCount: 1}, nil
}

func startWith(t *testing.T, cfg api.DaemonConfig) *testDaemon {
	t.Helper()
	dir := shortDir(t)
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Listen = []api.Addr{{Network: "unix", Address: filepath.Join(dir, "d.sock")}}
	cfg.Lanes = []string{"cpu"}
	if cfg.Run == nil {
		cfg.Run = videoRunner
	}
	cfg.Grace = time.Second
	d, err := api.StartDaemon(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(cfg.Listen[0].Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	td := &testDaemon{d: d, conn: conn, jobs: framepackv1.NewJobServiceClient(conn), devs: framepackv1.NewDeviceServiceClient(conn)}
	t.Cleanup(td.kill)
	return td
}

// TestDiskBudgetRefusesAtSubmit: a job whose files would not fit the budget is refused at
// submit with RESOURCE_EXHAUSTED and a message that says what to do; one that fits runs.
func TestDiskBudgetRefusesAtSubmit(t *testing.T) {
	td := startWith(t, api.DaemonConfig{DiskBudget: 1 << 30})
	big := &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 120}
	_, err := td.jobs.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: pngImage(t, 40, 30), Spec: big})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "disk budget") || !strings.Contains(err.Error(), "framepack rm") {
		t.Fatalf("120 s job under a 1 GiB budget: %v", err)
	}
	if n := plan.DiskBytes(api.WithDefaults(big)); n < 10<<30 {
		t.Fatalf("estimate of a 120 s 640 job: %d bytes, want the ~16 GB of float32 history it holds", n)
	}
	small := td.submit(t, &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1})
	if ev := td.watchAll(t, small.GetId(), false); ev[len(ev)-1].GetJobFinished() == nil {
		t.Fatalf("small job: %v", ev[len(ev)-1])
	}
}

// TestRetentionAndDelete: DeleteJob removes a finished job and its folder; the retention
// policy deletes the oldest finished jobs beyond its byte limit and keeps the newest.
func TestRetentionAndDelete(t *testing.T) {
	td := startWith(t, api.DaemonConfig{Retention: jobs.Retention{MaxBytes: 100 << 10}})
	var ids []string
	for range 3 {
		j := td.submit(t, &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1})
		td.watchAll(t, j.GetId(), false)
		ids = append(ids, j.GetId())
	}
	resp, err := td.jobs.DeleteJob(t.Context(), &framepackv1.DeleteJobRequest{JobId: ids[2]})
	if err != nil || resp.GetFreedBytes() < 64<<10 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	if _, err := os.Stat(td.d.Store().JobDir(ids[2]).Path()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("folder after delete: %v", err)
	}
	if _, err := td.jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: ids[2]}); status.Code(err) != codes.NotFound {
		t.Fatalf("get after delete: %v", err)
	}
	td.d.Sweep() // two 64 KiB jobs left, limit 100 KiB: the older goes
	if _, err := td.jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: ids[0]}); status.Code(err) != codes.NotFound {
		t.Fatalf("oldest job after the sweep: %v", err)
	}
	if _, err := td.jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: ids[1]}); err != nil {
		t.Fatalf("newest job after the sweep: %v", err)
	}
	// A finished job's video streams back in chunks; an offset resumes.
	stream, err := td.jobs.GetArtifact(t.Context(), &framepackv1.GetArtifactRequest{JobId: ids[1], Offset: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	for {
		c, err := stream.Recv()
		if err != nil {
			break
		}
		if c.GetOffset() != 1000+got {
			t.Fatalf("chunk at %d, want %d", c.GetOffset(), 1000+got)
		}
		got += int64(len(c.GetData()))
	}
	if got != 64<<10-1000 {
		t.Fatalf("streamed %d bytes from offset 1000 of 64 KiB", got)
	}
	stream, _ = td.jobs.GetArtifact(t.Context(), &framepackv1.GetArtifactRequest{JobId: ids[1], Offset: 1 << 20})
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("offset past the end: %v", err)
	}
}

// TestReadinessGatesSubmitAndHealth: while the readiness check fails, health is NOT_SERVING
// and SubmitJob refuses with the reason; when it passes again, both recover.
func TestReadinessGatesSubmitAndHealth(t *testing.T) {
	var broken atomic.Bool
	broken.Store(true)
	td := startWith(t, api.DaemonConfig{ReadyInterval: 10 * time.Millisecond, Ready: func() error {
		if broken.Load() {
			return errors.New("shared-memory folder /dev/shm/x was removed and cannot be made again")
		}
		return nil
	}})
	health := healthpb.NewHealthClient(td.conn)
	// The health service's Watch stream says every change: no polling.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	watch, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitHealth := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for {
			r, err := watch.Recv()
			if err != nil {
				t.Fatalf("health watch: %v, want %v", err, want)
			}
			if r.GetStatus() == want {
				return
			}
		}
	}
	waitHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	_, err = td.jobs.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: pngImage(t, 40, 30), Spec: &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shared-memory folder") {
		t.Fatalf("submit while not ready: %v", err)
	}
	broken.Store(false)
	waitHealth(healthpb.HealthCheckResponse_SERVING)
	td.submit(t, &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1})
}

// TestShareSocket: --socket-group gives the socket to a group with mode 0660.
func TestShareSocket(t *testing.T) {
	dir := shortDir(t)
	l, err := api.Listen(api.Addr{Network: "unix", Address: filepath.Join(dir, "s.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	gid := strconv.Itoa(os.Getgid())
	if err := api.ShareSocket(filepath.Join(dir, "s.sock"), gid); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "s.sock"))
	if err != nil || st.Mode().Perm() != 0o660 || strconv.Itoa(int(st.Sys().(*syscall.Stat_t).Gid)) != gid {
		t.Fatalf("socket %v %v", st.Mode(), err)
	}
	if err := api.ShareSocket(filepath.Join(dir, "s.sock"), "no-such-group-fpk"); err == nil || !strings.Contains(err.Error(), "no such group") {
		t.Fatalf("unknown group: %v", err)
	}
}

// TestWatchReplayMarked: a watch that starts after events happened gets them again marked
// replay, with the times they first happened (not the time of sending); the snapshot and live
// events are not marked.
func TestWatchReplayMarked(t *testing.T) {
	td := startWith(t, api.DaemonConfig{Run: func(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error) {
		emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TEXT_ENCODE, Attempt: 1}}})
		emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageFinished{StageFinished: &framepackv1.StageFinished{Stage: framepackv1.Stage_STAGE_TEXT_ENCODE, Attempt: 1}}})
		return videoRunner(ctx, job, emit)
	}})
	j := td.submit(t, &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1})
	live := td.watchAll(t, j.GetId(), false)
	ended := time.Now()
	replayed := td.watchAll(t, j.GetId(), false)
	if replayed[0].GetSnapshot() == nil || replayed[0].GetReplay() {
		t.Fatalf("first event %v: want an unmarked snapshot", replayed[0])
	}
	if len(replayed) < 3 {
		t.Fatalf("replayed %d events", len(replayed))
	}
	for i, ev := range replayed[1:] {
		if !ev.GetReplay() {
			t.Errorf("event %d %v not marked replay", i+1, ev)
		}
		if ev.GetTime().AsTime().After(ended) {
			t.Errorf("replayed event %d has time %v, after the job ended (%v): not its original time", i+1, ev.GetTime().AsTime(), ended)
		}
	}
	// The live watch saw the same events unmarked, with the same times.
	var liveTimes, replayTimes []time.Time
	for _, ev := range live[1:] {
		if ev.GetReplay() && ev.GetJobFinished() == nil {
			// A watch that started before the job ran may replay its first events.
			continue
		}
		liveTimes = append(liveTimes, ev.GetTime().AsTime())
	}
	for _, ev := range replayed[len(replayed)-len(liveTimes):] {
		replayTimes = append(replayTimes, ev.GetTime().AsTime())
	}
	for i := range liveTimes {
		if !liveTimes[i].Equal(replayTimes[i]) {
			t.Errorf("event %d: live time %v, replayed %v", i, liveTimes[i], replayTimes[i])
		}
	}
}
