package api_test

import (
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBatches submits a batch of three jobs over gRPC (one item with settings of its own),
// repeats it (the same jobs come back), refuses a batch with a bad item before submitting any,
// reads its counts, watches it and cancels it: every job of the batch ends cancelled and the
// watch stream ends with them.
func TestBatches(t *testing.T) {
	dir := shortDir(t)
	td := startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "s.sock"), []string{"cpu"}, holdRunner)
	bc := framepackv1.NewBatchServiceClient(td.conn)
	ctx := t.Context()
	req := &framepackv1.SubmitBatchRequest{BatchId: "cats-1", Spec: baseSpec(), Items: []*framepackv1.BatchItem{
		{Image: pngImage(t, 40, 30)},
		{Image: pngImage(t, 30, 40), Spec: &framepackv1.JobSpec{Steps: 7, Prompt: "a cat jumps"}},
		{Image: pngImage(t, 32, 32)},
	}}
	resp, err := bc.SubmitBatch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	b := resp.GetBatch()
	if b.GetBatchId() != "cats-1" || len(b.GetJobs()) != 3 || b.GetDone() {
		t.Fatalf("batch %v", b)
	}
	j1 := b.GetJobs()[1].GetSpec()
	if j1.GetSteps() != 7 || j1.GetPrompt() != "a cat jumps" || j1.GetBatchId() != "cats-1" || b.GetJobs()[0].GetSpec().GetSteps() != 3 {
		t.Errorf("item specs: %v / %v", b.GetJobs()[0].GetSpec(), j1)
	}
	again, err := bc.SubmitBatch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := range again.GetBatch().GetJobs() {
		if j.GetId() != b.GetJobs()[i].GetId() {
			t.Errorf("repeat: job %d is %s, first %s", i, j.GetId(), b.GetJobs()[i].GetId())
		}
	}
	if n := len(storedJobs(t, td)); n != 3 {
		t.Errorf("%d jobs stored after the repeat, want 3", n)
	}
	// A bad item: nothing of the batch is submitted.
	bad := &framepackv1.SubmitBatchRequest{BatchId: "dogs", Spec: baseSpec(), Items: []*framepackv1.BatchItem{
		{Image: pngImage(t, 40, 30)}, {Image: pngImage(t, 40, 30), Spec: &framepackv1.JobSpec{Steps: 500}}}}
	if _, err := bc.SubmitBatch(ctx, bad); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "items[1].spec.steps") {
		t.Errorf("bad item: %v", err)
	}
	if _, err := bc.GetBatch(ctx, &framepackv1.GetBatchRequest{BatchId: "dogs"}); status.Code(err) != codes.NotFound {
		t.Errorf("batch with a bad item: %v, want NOT_FOUND (nothing submitted)", err)
	}
	if _, err := bc.SubmitBatch(ctx, &framepackv1.SubmitBatchRequest{BatchId: "a/b", Items: bad.Items[:1], Spec: baseSpec()}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "batch_id") {
		t.Errorf("bad batch id: %v", err)
	}

	got, err := bc.GetBatch(ctx, &framepackv1.GetBatchRequest{BatchId: "cats-1"})
	if err != nil || got.GetBatch().GetQueued()+got.GetBatch().GetRunning() != 3 {
		t.Fatalf("get: %v %v", got, err)
	}
	stream, err := bc.WatchBatch(ctx, &framepackv1.WatchBatchRequest{BatchId: "cats-1"})
	if err != nil {
		t.Fatal(err)
	}
	ended := map[string]bool{}
	seen := make(chan error, 1)
	go func() {
		for {
			ev, err := stream.Recv()
			if err == io.EOF {
				seen <- nil
				return
			}
			if err != nil {
				seen <- err
				return
			}
			if ev.GetJobCancelled() != nil {
				ended[ev.GetJobId()] = true
			}
		}
	}()
	c, err := bc.CancelBatch(ctx, &framepackv1.CancelBatchRequest{BatchId: "cats-1", Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !c.GetBatch().GetDone() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		g, err := bc.GetBatch(ctx, &framepackv1.GetBatchRequest{BatchId: "cats-1"})
		if err != nil {
			t.Fatal(err)
		}
		c = &framepackv1.CancelBatchResponse{Batch: g.GetBatch()}
	}
	if c.GetBatch().GetCancelled() != 3 || !c.GetBatch().GetDone() {
		t.Fatalf("after cancel: %v", c.GetBatch())
	}
	select {
	case err := <-seen:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch stream did not end after every job ended")
	}
	if len(ended) != 3 {
		t.Errorf("watch saw %d jobs cancelled, want 3", len(ended))
	}
}
