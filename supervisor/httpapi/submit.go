package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// maxSpecBytes bounds the multipart "spec" part (a JobSpec as JSON: two prompts of at most
// 64 KiB each and a few numbers).
const maxSpecBytes = 512 << 10

// submit takes POST /v1/jobs: a multipart upload here, anything else (the JSON
// SubmitJobRequest) through the gateway.
func (h *handler) submit(w http.ResponseWriter, r *http.Request) {
	serveMultipart(h, w, r, h.readMultipart, func(ctx context.Context, req *framepackv1.SubmitJobRequest) (*framepackv1.SubmitJobResponse, error) {
		return h.jobs.SubmitJob(ctx, req)
	}, "")
}

// serveMultipart answers a multipart/form-data POST: its body read by read, the request sent
// by call and the response written as the gateway writes it; any other body goes to the
// gateway. A body over the limit is 413, its message followed by hint when there is one.
func serveMultipart[Req any, Resp proto.Message](h *handler, w http.ResponseWriter, r *http.Request,
	read func(*http.Request) (Req, error), call func(context.Context, Req) (Resp, error), hint string) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		h.gw.ServeHTTP(w, r)
		return
	}
	if params["boundary"] == "" {
		h.writeError(w, r, status.Error(codes.InvalidArgument, "multipart/form-data without a boundary"))
		return
	}
	req, err := read(r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			h.writeTooLarge(w, r, hint)
			return
		}
		h.writeError(w, r, err)
		return
	}
	resp, err := call(r.Context(), req)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeProto(w, http.StatusOK, resp)
}

// readMultipart reads the "image" file part, the "spec" part (a JobSpec as JSON) and the
// optional "end_image" file part (JobSpec.end_image) of a multipart submit. Other parts are an error, so a typo does not pass silently.
func (h *handler) readMultipart(r *http.Request) (*framepackv1.SubmitJobRequest, error) {
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "read multipart body: %v", err)
	}
	req := &framepackv1.SubmitJobRequest{}
	var haveImage, haveSpec bool
	var filename string
	var endImage []byte
	var files extraParts
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
			if haveImage {
				return nil, status.Error(codes.InvalidArgument, `multipart body has two "image" parts`)
			}
			haveImage = true
			filename = filepath.Base(part.FileName())
			data, err := io.ReadAll(io.LimitReader(part, h.cfg.MaxUploadBytes+1))
			if err != nil {
				return nil, bodyError("read image part", err)
			}
			if int64(len(data)) > h.cfg.MaxUploadBytes {
				return nil, status.Errorf(codes.InvalidArgument, "image: more than %d bytes", h.cfg.MaxUploadBytes)
			}
			req.Image = data
		case "end_image":
			// The end frame as a file part, like the image (or base64 in the spec's end_image).
			if len(endImage) > 0 {
				return nil, status.Error(codes.InvalidArgument, `multipart body has two "end_image" parts`)
			}
			data, err := io.ReadAll(io.LimitReader(part, h.cfg.MaxUploadBytes+1))
			if err != nil {
				return nil, bodyError("read end_image part", err)
			}
			if int64(len(data)) > h.cfg.MaxUploadBytes {
				return nil, status.Errorf(codes.InvalidArgument, "end_image: more than %d bytes", h.cfg.MaxUploadBytes)
			}
			if len(data) == 0 {
				return nil, status.Error(codes.InvalidArgument, `multipart "end_image" part is empty`)
			}
			endImage = data
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
		case "keyframe", "input_video":
			if err := files.read(part, h.cfg.MaxUploadBytes); err != nil {
				return nil, err
			}
		default:
			return nil, status.Errorf(codes.InvalidArgument, "multipart part %q: want \"image\" (the file), \"spec\" (a JobSpec as JSON) and optionally \"end_image\" (the end frame), \"keyframe\" (one per keyframe of the spec) and \"input_video\" (a video to extend, instead of the image)", part.FormName())
		}
		_ = part.Close()
	}
	if !haveSpec {
		return nil, status.Error(codes.InvalidArgument, `multipart body has no "spec" part (a JobSpec as JSON)`)
	}
	if err := files.apply(req.Spec); err != nil {
		return nil, err
	}
	if !haveImage && len(req.Spec.GetInputVideo()) == 0 && req.Spec.GetInputVideoJobId() == "" {
		return nil, status.Error(codes.InvalidArgument, `multipart body has no "image" part (or "input_video" part, to extend a video)`)
	}
	if len(endImage) > 0 {
		if len(req.Spec.GetEndImage()) > 0 {
			return nil, status.Error(codes.InvalidArgument, `the end frame is given twice: as the "end_image" part and in the spec's end_image`)
		}
		req.Spec.EndImage = endImage
	}
	if req.Spec.GetImageFilename() == "" && filename != "." && filename != "/" {
		req.Spec.ImageFilename = filename
	}
	return req, nil
}

// bodyError keeps a body-limit error recognisable and turns the rest into INVALID_ARGUMENT.
func bodyError(what string, err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
}
