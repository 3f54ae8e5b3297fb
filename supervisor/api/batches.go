package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MaxBatchItems bounds SubmitBatchRequest.items.
const MaxBatchItems = 1000

// batchIDPattern is a batch id: 1 to 64 letters, digits and ._- characters.
var batchIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// checkBatchID checks a batch id on field.
func checkBatchID(v *Violations, field, id string) {
	if !batchIDPattern.MatchString(id) {
		v.Add(field, "%q: a batch id is 1 to 64 letters, digits and ._- characters", id)
	}
}

// BatchRequestID is the client_request_id of item i of batch id: what makes a repeated batch
// return its jobs instead of adding more.
func BatchRequestID(id string, i int) string { return fmt.Sprintf("%s/%d", id, i) }

// batchItems turns a SubmitBatchRequest into one SubmitJobRequest per item (the item's spec over
// the batch's, the batch id set, the idempotency id derived), checked as SubmitJob checks them;
// violations name the item.
func (s *Server) batchItems(ctx context.Context, req *framepackv1.SubmitBatchRequest, id string) ([]*framepackv1.SubmitJobRequest, error) {
	var v Violations
	checkBatchID(&v, "batch_id", id)
	switch n := len(req.GetItems()); {
	case n == 0:
		v.Add("items", "required: one item (an image, and its settings) per job")
	case n > MaxBatchItems:
		v.Add("items", "%d items, the limit is %d: split the batch", n, MaxBatchItems)
	}
	if b := req.GetSpec().GetBatchId(); b != "" && b != id {
		v.Add("spec.batch_id", "%q differs from the batch's id %q: leave it unset", b, id)
	}
	if err := v.Err("SubmitBatchRequest"); err != nil {
		return nil, err
	}
	out := make([]*framepackv1.SubmitJobRequest, len(req.GetItems()))
	for i, it := range req.GetItems() {
		field := fmt.Sprintf("items[%d]", i)
		if b := it.GetSpec().GetBatchId(); b != "" && b != id {
			v.Add(field+".spec.batch_id", "%q differs from the batch's id %q: leave it unset", b, id)
			continue
		}
		spec := jobs.FillUnset(it.GetSpec(), req.GetSpec())
		spec.BatchId = id
		jr := &framepackv1.SubmitJobRequest{Image: it.GetImage(), Spec: spec, ClientRequestId: BatchRequestID(id, i)}
		out[i] = jr
		merged, err := s.withPreset(jr)
		if err != nil {
			v.Add(field+".spec.preset", "%s", status.Convert(err).Message())
			continue
		}
		iv := validateSubmit(merged, s.cfg.Queue.Lanes(), s.decoder(ctx))
		checkVariant(&iv, merged.GetSpec().GetVariant(), s.cfg.CheckVariant)
		for _, fv := range iv {
			v.Add(field+"."+fv.GetField(), "%s", fv.GetDescription())
		}
	}
	if err := v.Err("SubmitBatchRequest"); err != nil {
		return nil, err
	}
	return out, nil
}

// SubmitBatch submits every item of a batch as a job, after checking them all.
func (s *Server) SubmitBatch(ctx context.Context, req *framepackv1.SubmitBatchRequest) (*framepackv1.SubmitBatchResponse, error) {
	id := req.GetBatchId()
	if id == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, status.Errorf(codes.Internal, "batch id: %v", err)
		}
		id = "b-" + hex.EncodeToString(b[:])
	}
	items, err := s.batchItems(ctx, req, id)
	if err != nil {
		return nil, err
	}
	for i, it := range items {
		if _, err := s.SubmitJob(ctx, it); err != nil {
			st := status.Convert(err)
			return nil, status.Errorf(st.Code(), "batch %s: item %d: %s (items before it are submitted: send the batch again once this is mended; its submitted items are not repeated)",
				id, i, st.Message())
		}
	}
	b, err := s.batch(id)
	if err != nil {
		return nil, err
	}
	s.log.WithFields(logrus.Fields{"batch": id, "jobs": len(b.GetJobs())}).Info("batch submitted")
	return &framepackv1.SubmitBatchResponse{Batch: b}, nil
}

// batch returns the batch's jobs, oldest first, and counts; NOT_FOUND when no job names it.
func (s *Server) batch(id string) (*framepackv1.Batch, error) {
	var v Violations
	checkBatchID(&v, "batch_id", id)
	if err := v.Err("request"); err != nil {
		return nil, err
	}
	b := &framepackv1.Batch{BatchId: id}
	token := ""
	for {
		list, next, err := s.cfg.Store.List(jobs.ListOptions{PageSize: jobs.MaxPageSize, PageToken: token})
		if err != nil {
			return nil, statusOf(err)
		}
		for _, j := range list {
			if j.GetSpec().GetBatchId() == id {
				b.Jobs = append(b.Jobs, j)
			}
		}
		if next == "" {
			break
		}
		token = next
	}
	if len(b.Jobs) == 0 {
		return nil, status.Errorf(codes.NotFound, "no batch %q (no job names it)", id)
	}
	slices.Reverse(b.Jobs) // List is newest first
	for _, j := range b.Jobs {
		switch j.GetState() {
		case framepackv1.JobState_JOB_STATE_QUEUED:
			b.Queued++
		case framepackv1.JobState_JOB_STATE_RUNNING:
			b.Running++
		case framepackv1.JobState_JOB_STATE_SUCCEEDED:
			b.Succeeded++
		case framepackv1.JobState_JOB_STATE_FAILED:
			b.Failed++
		case framepackv1.JobState_JOB_STATE_CANCELLED:
			b.Cancelled++
		}
	}
	b.Done = b.Queued == 0 && b.Running == 0
	return b, nil
}

// GetBatch returns a batch.
func (s *Server) GetBatch(_ context.Context, req *framepackv1.GetBatchRequest) (*framepackv1.GetBatchResponse, error) {
	b, err := s.batch(req.GetBatchId())
	if err != nil {
		return nil, err
	}
	return &framepackv1.GetBatchResponse{Batch: b}, nil
}

// CancelBatch cancels every queued or running job of a batch.
func (s *Server) CancelBatch(ctx context.Context, req *framepackv1.CancelBatchRequest) (*framepackv1.CancelBatchResponse, error) {
	var v Violations
	checkReason(&v, req.GetReason())
	if err := v.Err("CancelBatchRequest"); err != nil {
		return nil, err
	}
	b, err := s.batch(req.GetBatchId())
	if err != nil {
		return nil, err
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "batch " + b.GetBatchId() + " cancelled"
	}
	var failed []string
	for _, j := range b.GetJobs() {
		if b.Done || isEnded(j.GetState()) {
			continue
		}
		if _, err := s.cfg.Queue.Cancel(ctx, j.GetId(), reason); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", j.GetId(), err))
		}
	}
	if len(failed) > 0 {
		return nil, status.Errorf(codes.Internal, "cancel batch %s: %s", b.GetBatchId(), strings.Join(failed, "; "))
	}
	s.log.WithFields(logrus.Fields{"batch": b.GetBatchId(), "jobs": len(b.GetJobs())}).Info("batch cancel requested")
	if b, err = s.batch(req.GetBatchId()); err != nil {
		return nil, err
	}
	return &framepackv1.CancelBatchResponse{Batch: b}, nil
}

func isEnded(st framepackv1.JobState) bool {
	return st == framepackv1.JobState_JOB_STATE_SUCCEEDED || st == framepackv1.JobState_JOB_STATE_FAILED || st == framepackv1.JobState_JOB_STATE_CANCELLED
}

// WatchBatch streams every job's events of a batch until each has ended: one watcher per job
// (as WatchJob), their events sent one at a time.
func (s *Server) WatchBatch(req *framepackv1.WatchBatchRequest, stream grpc.ServerStreamingServer[framepackv1.JobEvent]) error {
	b, err := s.batch(req.GetBatchId())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	var mu sync.Mutex
	send := func(ev *framepackv1.JobEvent) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(proto.Clone(ev).(*framepackv1.JobEvent))
	}
	errs := make(chan error, len(b.GetJobs()))
	for _, j := range b.GetJobs() {
		go func() { errs <- s.watchOne(ctx, j.GetId(), false, send) }()
	}
	var first error
	for range b.GetJobs() {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel() // the others stop too
		}
	}
	return first
}
