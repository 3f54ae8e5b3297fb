package api_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// holdRunner keeps every job running until the daemon stops.
func holdRunner(ctx context.Context, _ *jobs.Job, _ func(*framepackv1.JobEvent)) (jobs.Result, error) {
	<-ctx.Done()
	return jobs.Result{}, context.Cause(ctx)
}

// failRunner fails every job at once.
func failRunner(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error) {
	return jobs.Result{}, &jobs.FailureError{Failure: &framepackv1.JobFailure{Message: "scripted failure", Stage: framepackv1.Stage_STAGE_VAE_DECODE}}
}

func storedJobs(t *testing.T, td *testDaemon) []*framepackv1.Job {
	t.Helper()
	list, _, err := td.d.Store().List(jobs.ListOptions{PageSize: jobs.MaxPageSize})
	if err != nil {
		t.Fatal(err)
	}
	return list
}

func submitOnce(ctx context.Context, td *testDaemon, id string, image []byte, spec *framepackv1.JobSpec) (*framepackv1.Job, error) {
	resp, err := td.jobs.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: image, Spec: spec, ClientRequestId: id})
	return resp.GetJob(), err
}

func TestSubmitClientRequestID(t *testing.T) {
	dir := shortDir(t)
	td := startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "s.sock"), []string{"cpu"}, holdRunner)
	img := pngImage(t, 40, 30)

	first, err := submitOnce(t.Context(), td, "req-1", img, baseSpec())
	if err != nil {
		t.Fatal(err)
	}
	again, err := submitOnce(t.Context(), td, "req-1", img, baseSpec())
	if err != nil {
		t.Fatal(err)
	}
	if again.GetId() != first.GetId() || !jobs.ValidID(first.GetId()) {
		t.Fatalf("repeat gave job %q, the first %q", again.GetId(), first.GetId())
	}
	if n := len(storedJobs(t, td)); n != 1 {
		t.Fatalf("%d jobs stored after a repeated submit, want 1", n)
	}

	other, err := submitOnce(t.Context(), td, "req-2", img, baseSpec())
	if err != nil {
		t.Fatal(err)
	}
	plain, err := submitOnce(t.Context(), td, "", img, baseSpec())
	if err != nil {
		t.Fatal(err)
	}
	if other.GetId() == first.GetId() || plain.GetId() == first.GetId() || plain.GetId() == other.GetId() {
		t.Fatalf("distinct submissions share a job: %s %s %s", first.GetId(), other.GetId(), plain.GetId())
	}
	if n := len(storedJobs(t, td)); n != 3 {
		t.Fatalf("%d jobs stored, want 3", n)
	}

	// The same id with another spec or image names a different request.
	changed := baseSpec()
	changed.Prompt = "another prompt"
	for name, sub := range map[string]func() (*framepackv1.Job, error){
		"spec": func() (*framepackv1.Job, error) { return submitOnce(t.Context(), td, "req-1", img, changed) },
		"image": func() (*framepackv1.Job, error) {
			return submitOnce(t.Context(), td, "req-1", pngImage(t, 42, 30), baseSpec())
		},
	} {
		_, err := sub()
		if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), `"req-1"`) || !strings.Contains(err.Error(), first.GetId()) {
			t.Errorf("same id, other %s: %v; want ALREADY_EXISTS naming the id and the job", name, err)
		}
	}

	for _, tc := range []struct{ id, want string }{
		{strings.Repeat("x", 129), "at most 128"},
		{"has space", "printable ASCII"},
		{"tab\there", "printable ASCII"},
		{"caf\u00e9", "printable ASCII"},
	} {
		_, err := submitOnce(t.Context(), td, tc.id, img, baseSpec())
		code, fields, msg := violations(t, err)
		if code != codes.InvalidArgument || len(fields) != 1 || fields[0] != "client_request_id" || !strings.Contains(msg, tc.want) {
			t.Errorf("id %q: %v %v %q; want INVALID_ARGUMENT on client_request_id saying %q", tc.id, code, fields, msg, tc.want)
		}
	}
	if _, err := submitOnce(t.Context(), td, strings.Repeat("~", 128), img, baseSpec()); err != nil {
		t.Errorf("128 printable characters refused: %v", err)
	}
}

// A submission with a client request id and no spec is refused like one without the id.
func TestSubmitClientRequestIDWithoutSpec(t *testing.T) {
	dir := shortDir(t)
	td := startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "s.sock"), []string{"cpu"}, holdRunner)
	_, err := submitOnce(t.Context(), td, "no-spec", pngImage(t, 40, 30), nil)
	code, fields, msg := violations(t, err)
	if code != codes.InvalidArgument || len(fields) != 1 || fields[0] != "spec" || !strings.Contains(msg, "required") {
		t.Fatalf("no spec: %v %v %q; want INVALID_ARGUMENT on spec saying required", code, fields, msg)
	}
	if n := len(storedJobs(t, td)); n != 0 {
		t.Fatalf("%d jobs stored, want 0", n)
	}
}

func TestSubmitClientRequestIDConcurrent(t *testing.T) {
	dir := shortDir(t)
	td := startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "s.sock"), []string{"cpu"}, holdRunner)
	img := pngImage(t, 40, 30)
	const n = 8
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			job, err := submitOnce(t.Context(), td, "same-request", img, baseSpec())
			ids[i], errs[i] = job.GetId(), err
		}()
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent submits with one id gave jobs %v", ids)
		}
	}
	if list := storedJobs(t, td); len(list) != 1 || list[0].GetId() != ids[0] {
		t.Fatalf("stored %d jobs, want only %s", len(list), ids[0])
	}
}

// A daemon restarted after a crash still maps the id to its job, also once the job has ended.
func TestSubmitClientRequestIDSurvivesRestart(t *testing.T) {
	dir := shortDir(t)
	state, sock := filepath.Join(dir, "state"), filepath.Join(dir, "s.sock")
	img := pngImage(t, 40, 30)
	td := startDaemon(t, state, sock, []string{"cpu"}, holdRunner)
	first, err := submitOnce(t.Context(), td, "before-crash", img, baseSpec())
	if err != nil {
		t.Fatal(err)
	}
	td.kill()

	td2 := startDaemon(t, state, sock, []string{"cpu"}, failRunner)
	again, err := submitOnce(t.Context(), td2, "before-crash", img, baseSpec())
	if err != nil {
		t.Fatal(err)
	}
	if again.GetId() != first.GetId() {
		t.Fatalf("after a restart the id gave job %s, the first was %s", again.GetId(), first.GetId())
	}
	evs := td2.watchAll(t, first.GetId(), false)
	if evs[len(evs)-1].GetJobFailed() == nil {
		t.Fatalf("job did not fail as scripted: %v", kinds(evs))
	}
	ended, err := submitOnce(t.Context(), td2, "before-crash", img, baseSpec())
	if err != nil || ended.GetId() != first.GetId() || ended.GetState() != framepackv1.JobState_JOB_STATE_FAILED {
		t.Fatalf("repeat after the job failed: %v %v; want job %s FAILED", ended, err, first.GetId())
	}
	if n := len(storedJobs(t, td2)); n != 1 {
		t.Fatalf("%d jobs stored, want 1", n)
	}

	// Deleting the job frees its id.
	if _, err := td2.jobs.DeleteJob(t.Context(), &framepackv1.DeleteJobRequest{JobId: first.GetId()}); err != nil {
		t.Fatal(err)
	}
	fresh, err := submitOnce(t.Context(), td2, "before-crash", img, baseSpec())
	if err != nil || fresh.GetId() == first.GetId() {
		t.Fatalf("submit after delete: %v %v; want a new job", fresh, err)
	}
}

// A server that cannot run jobs says so with ErrorInfo NOT_READY (the CLI does not retry it as
// a lost connection), yet still answers the repeat of a submission it stored.
func TestSubmitClientRequestIDNotReady(t *testing.T) {
	dir := shortDir(t)
	state, sock := filepath.Join(dir, "state"), filepath.Join(dir, "s.sock")
	img := pngImage(t, 40, 30)
	td := startDaemon(t, state, sock, []string{"cpu"}, holdRunner)
	first, err := submitOnce(t.Context(), td, "stored-when-ready", img, baseSpec())
	if err != nil {
		t.Fatal(err)
	}
	td.kill()

	td2 := startDaemon(t, state, sock, []string{"cpu"}, holdRunner, func(cfg *api.DaemonConfig) {
		cfg.Ready = func() error { return errors.New("the models are still loading") }
	})

	again, err := submitOnce(t.Context(), td2, "stored-when-ready", img, baseSpec())
	if err != nil || again.GetId() != first.GetId() {
		t.Fatalf("repeat to a server that is not ready: %v %v; want job %s", again, err, first.GetId())
	}
	_, err = submitOnce(t.Context(), td2, "new-request", img, baseSpec())
	st, _ := status.FromError(err)
	var reasons []string
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			reasons = append(reasons, info.GetDomain()+"/"+info.GetReason())
		}
	}
	if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "models are still loading") ||
		len(reasons) != 1 || reasons[0] != api.ErrorDomain+"/"+api.ReasonNotReady {
		t.Fatalf("new job on a server that is not ready: %v, error info %v", err, reasons)
	}
}
