package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/video"
)

// maxSection bounds a section number in a URL (a 120 s video at window 1 has 1,080 sections;
// the pipeline names files with at least three digits).
const maxSection = 100_000

// finalVideo serves a succeeded job's MP4.
func (h *handler) finalVideo(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("jobId")
	resp, err := h.jobs.GetJob(r.Context(), &framepackv1.GetJobRequest{JobId: id})
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	job := resp.GetJob()
	path := job.GetResult().GetVideoPath()
	if job.GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED || path == "" {
		h.writeError(w, r, status.Errorf(codes.FailedPrecondition, "job %s has no final video (it is %s); its sections' videos are at /v1/jobs/%s/sections/N/video",
			id, strings.TrimPrefix(job.GetState().String(), "JOB_STATE_"), id))
		return
	}
	h.serveVideo(w, r, id, path, fmt.Sprintf("framepack-%s.mp4", id))
}

// sectionVideo serves the MP4 written after section n of a job (the video so far).
func (h *handler) sectionVideo(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("jobId")
	n, err := strconv.Atoi(r.PathValue("n"))
	if err != nil || n < 0 || n >= maxSection {
		h.writeError(w, r, status.Errorf(codes.InvalidArgument, "section %q: want a number from 0 to %d", r.PathValue("n"), maxSection-1))
		return
	}
	// GetJob first: an unknown job reads as the gRPC API says it.
	if _, err := h.jobs.GetJob(r.Context(), &framepackv1.GetJobRequest{JobId: id}); err != nil {
		h.writeError(w, r, err)
		return
	}
	path := filepath.Join(h.cfg.JobDir(id), "video", fmt.Sprintf("section-%03d.mp4", n))
	h.serveVideo(w, r, id, path, fmt.Sprintf("framepack-%s-section-%03d.mp4", id, n))
}

// serveVideo serves the MP4 at path, which must lie in job id's directory, with range
// requests, Last-Modified and conditional requests (http.ServeContent).
func (h *handler) serveVideo(w http.ResponseWriter, r *http.Request, id, path, name string) {
	dir := filepath.Clean(h.cfg.JobDir(id)) + string(filepath.Separator)
	clean := filepath.Clean(path)
	if !strings.HasPrefix(clean, dir) {
		h.log.WithFields(map[string]any{"job": id, "path": path}).Warn("video path outside the job directory; not served")
		h.writeError(w, r, status.Errorf(codes.NotFound, "job %s: video not found", id))
		return
	}
	// A video so far is joined from its segments when first read (video.Materialize).
	if _, err := (&video.Writer{}).Materialize(r.Context(), clean); err != nil && !errors.Is(err, os.ErrNotExist) {
		h.log.WithError(err).WithField("job", id).Warn("join the video so far")
		h.writeError(w, r, status.Errorf(codes.Internal, "job %s: join %s: %v", id, filepath.Base(clean), err))
		return
	}
	f, err := os.Open(clean)
	if err != nil {
		h.writeError(w, r, status.Errorf(codes.NotFound, "job %s: video %s not found (not written yet, or removed)", id, filepath.Base(clean)))
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		// Without ffmpeg the pipeline keeps PNG frame folders instead of MP4s.
		h.writeError(w, r, status.Errorf(codes.NotFound, "job %s: %s is not an MP4 file (was ffmpeg missing?)", id, filepath.Base(clean)))
		return
	}
	w.Header().Set("Content-Type", "video/mp4")
	w.Header().Set("Cache-Control", "no-cache")
	disp := "inline"
	if v, _ := strconv.ParseBool(r.URL.Query().Get("download")); v {
		disp = "attachment"
	}
	w.Header().Set("Content-Disposition", fmt.Sprintf("%s; filename=%q", disp, name))
	http.ServeContent(w, r, name, st.ModTime(), f)
}

// artifactKinds maps a file route's last path element to the artifact GetArtifact sends.
var artifactKinds = map[string]framepackv1.ArtifactKind{
	"image":     framepackv1.ArtifactKind_ARTIFACT_KIND_IMAGE,
	"end-image": framepackv1.ArtifactKind_ARTIFACT_KIND_END_IMAGE,
	"thumbnail": framepackv1.ArtifactKind_ARTIFACT_KIND_THUMBNAIL,
}

// artifact serves one of a job's small files (its start or end image, its thumbnail) through
// GetArtifact, so the gRPC API decides what exists and where it lies. The type is sniffed
// from the file's first bytes.
func (h *handler) artifact(name string) http.HandlerFunc {
	kind, ok := artifactKinds[name]
	if !ok {
		panic("httpapi: unknown artifact route " + name) // the route table is fixed at build time
	}
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("jobId")
		stream, err := h.jobs.GetArtifact(r.Context(), &framepackv1.GetArtifactRequest{JobId: id, Kind: kind})
		first, ok := openStream(h, w, r, stream, err)
		if !ok {
			return
		}
		w.Header().Set("Content-Type", http.DetectContentType(first.GetData()))
		w.Header().Set("Content-Length", strconv.FormatInt(first.GetTotalSize(), 10))
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("Content-Disposition", fmt.Sprintf("inline; filename=%q", first.GetName()))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		for chunk := first; ; {
			if _, err := w.Write(chunk.GetData()); err != nil {
				return
			}
			if chunk, err = stream.Recv(); err != nil {
				if !errors.Is(err, io.EOF) {
					h.log.WithFields(map[string]any{"job": id, "file": name}).WithError(err).Warn("artifact stream broke off")
				}
				return
			}
		}
	}
}

// openStream takes the opening of a server stream: the call's error, else its first message.
// An error from either is written as the HTTP error and ok is false.
func openStream[T any](h *handler, w http.ResponseWriter, r *http.Request, stream grpc.ServerStreamingClient[T], err error) (first *T, ok bool) {
	if err == nil {
		if first, err = stream.Recv(); err == nil {
			return first, true
		}
	}
	h.writeError(w, r, err)
	return nil, false
}
