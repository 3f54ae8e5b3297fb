package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// submitBatch takes POST /v1/batches: a multipart upload here (one "image" part per job, one
// "spec" part for all, an optional "batch_id" part), anything else (the JSON SubmitBatchRequest)
// through the gateway. The whole batch goes to SubmitBatch in one call, so every item is checked
// before any is submitted; its size is bounded by the gRPC message limit.
func (h *handler) submitBatch(w http.ResponseWriter, r *http.Request) {
	serveMultipart(h, w, r, h.readBatchMultipart, func(ctx context.Context, req *framepackv1.SubmitBatchRequest) (*framepackv1.SubmitBatchResponse, error) {
		return framepackv1.NewBatchServiceClient(h.cfg.Conn).SubmitBatch(ctx, req)
	}, "submit a larger batch with the CLI, one job at a time")
}

// readBatchMultipart reads a multipart batch: "image" file parts (one job each, its file name
// the job's image_filename), a "spec" part (a JobSpec as JSON, every job's settings) and an
// optional "batch_id" part.
func (h *handler) readBatchMultipart(r *http.Request) (*framepackv1.SubmitBatchRequest, error) {
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "read multipart body: %v", err)
	}
	req := &framepackv1.SubmitBatchRequest{}
	haveSpec := false
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, bodyError("read multipart body", err)
		}
		switch part.FormName() {
		case "image":
			data, err := io.ReadAll(io.LimitReader(part, h.cfg.MaxUploadBytes+1))
			if err != nil {
				return nil, bodyError("read image part", err)
			}
			if int64(len(data)) > h.cfg.MaxUploadBytes {
				return nil, status.Errorf(codes.InvalidArgument, "image %d: more than %d bytes", len(req.Items), h.cfg.MaxUploadBytes)
			}
			it := &framepackv1.BatchItem{Image: data}
			if name := filepath.Base(part.FileName()); name != "." && name != "/" {
				it.Spec = &framepackv1.JobSpec{ImageFilename: name}
			}
			req.Items = append(req.Items, it)
		case "spec":
			if haveSpec {
				return nil, status.Error(codes.InvalidArgument, `multipart body has two "spec" parts`)
			}
			haveSpec = true
			raw, err := io.ReadAll(io.LimitReader(part, maxSpecBytes+1))
			if err != nil {
				return nil, bodyError("read spec part", err)
			}
			if len(raw) > maxSpecBytes {
				return nil, status.Errorf(codes.InvalidArgument, "spec: more than %d bytes", maxSpecBytes)
			}
			spec := &framepackv1.JobSpec{}
			if err := protojson.Unmarshal(raw, spec); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "spec: not a JobSpec in JSON: %v", err)
			}
			req.Spec = spec
		case "batch_id":
			raw, err := io.ReadAll(io.LimitReader(part, 1<<10))
			if err != nil {
				return nil, bodyError("read batch_id part", err)
			}
			req.BatchId = string(raw)
		default:
			return nil, status.Errorf(codes.InvalidArgument, "multipart part %q: want \"image\" (one per job), \"spec\" (a JobSpec as JSON) and optionally \"batch_id\"", part.FormName())
		}
		_ = part.Close()
	}
	if len(req.Items) == 0 {
		return nil, status.Error(codes.InvalidArgument, `multipart body has no "image" part`)
	}
	if !haveSpec {
		return nil, status.Error(codes.InvalidArgument, `multipart body has no "spec" part (a JobSpec as JSON)`)
	}
	return req, nil
}
