package api

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"context"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/video"
)

// ArtifactChunkBytes is the most file bytes one GetArtifactResponse carries.
const ArtifactChunkBytes = 1 << 20

// artifactPath returns the video of job: the final one of a succeeded job, else the newest
// section video.
func (s *Server) artifactPath(job *framepackv1.Job) (string, error) {
	p := job.GetResult().GetVideoPath()
	if p == "" {
		p = job.GetProgress().GetLatestVideoPath()
	}
	if p == "" {
		return "", status.Errorf(codes.NotFound, "job %s has no video yet (it is %s)", job.GetId(), stateText(job.GetState()))
	}
	return p, nil
}

// imageExts are the names the store gives a submitted image (jobs.ImageExt).
var imageExts = []string{".png", ".jpg", ".webp", ".img"}

// openArtifact opens the file of job that kind names, through the store (which fetches it
// where the job ran on another daemon), and says what it is in messages and the name a client
// should save it as: the video (kind unspecified or video), the start image, the end image or
// the thumbnail. An error is a status.
func (s *Server) openArtifact(ctx context.Context, job *framepackv1.Job, kind framepackv1.ArtifactKind) (f *os.File, path, what, name string, err error) {
	id := job.GetId()
	dir := s.cfg.Store.JobDir(id)
	var candidates []string
	switch kind {
	case framepackv1.ArtifactKind_ARTIFACT_KIND_IMAGE, framepackv1.ArtifactKind_ARTIFACT_KIND_END_IMAGE:
		base, suffix := "input", "-start"
		what = "start image"
		if kind == framepackv1.ArtifactKind_ARTIFACT_KIND_END_IMAGE {
			if job.GetSpec().GetEndImageSha256() == "" {
				return nil, "", "", "", status.Errorf(codes.NotFound, "job %s has no end image", id)
			}
			base, suffix, what = "end", "-end", "end image"
		}
		for _, ext := range imageExts {
			candidates = append(candidates, filepath.Join(dir.Path(), base+ext))
		}
		name = id + suffix
	case framepackv1.ArtifactKind_ARTIFACT_KIND_THUMBNAIL:
		candidates, what, name = []string{dir.Thumbnail()}, "thumbnail", id+"-thumbnail.jpg"
	default:
		p, err := s.artifactPath(job)
		if err != nil {
			return nil, "", "", "", err
		}
		// The video so far of a running job is joined from its segments when first read.
		if _, err := (&video.Writer{}).Materialize(ctx, p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, "", "", "", status.Errorf(codes.Internal, "job %s: join its video so far: %v", id, err)
		}
		candidates, what, name = []string{p}, "video", id+filepath.Ext(p)
	}
	for _, p := range candidates {
		f, err = s.cfg.Store.OpenVideo(id, p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, "", "", "", status.Errorf(codes.Internal, "job %s: open %s: %v", id, what, err)
		}
		if what == "start image" || what == "end image" {
			name += filepath.Ext(p)
		}
		return f, p, what, name, nil
	}
	if what == "thumbnail" {
		return nil, "", "", "", status.Errorf(codes.NotFound, "job %s has no thumbnail yet (one is written with every section; it is %s)", id, stateText(job.GetState()))
	}
	return nil, "", "", "", status.Errorf(codes.NotFound, "job %s: its %s is gone from the server (deleted by retention or rm)", id, what)
}

func stateText(st framepackv1.JobState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "JOB_STATE_"))
}

// GetArtifact streams a job's video (or, by kind, its start or end image or thumbnail) in
// chunks of up to ArtifactChunkBytes, from req.offset.
func (s *Server) GetArtifact(req *framepackv1.GetArtifactRequest, stream grpc.ServerStreamingServer[framepackv1.GetArtifactResponse]) error {
	id := req.GetJobId()
	if err := requireID(id); err != nil {
		return err
	}
	var v Violations
	if req.GetOffset() < 0 {
		v.Add("offset", "must be 0 or more, got %d", req.GetOffset())
	}
	switch req.GetKind() {
	case framepackv1.ArtifactKind_ARTIFACT_KIND_UNSPECIFIED, framepackv1.ArtifactKind_ARTIFACT_KIND_VIDEO,
		framepackv1.ArtifactKind_ARTIFACT_KIND_IMAGE, framepackv1.ArtifactKind_ARTIFACT_KIND_END_IMAGE,
		framepackv1.ArtifactKind_ARTIFACT_KIND_THUMBNAIL:
	default:
		v.Add("kind", "unknown artifact kind %d", req.GetKind())
	}
	if err := v.Err("GetArtifactRequest"); err != nil {
		return err
	}
	job, err := s.cfg.Store.Get(id)
	if err != nil {
		return jobStatus(err, id)
	}
	f, path, what, name, err := s.openArtifact(stream.Context(), job, req.GetKind())
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return status.Errorf(codes.Internal, "job %s: stat %s: %v", id, what, err)
	}
	if st.IsDir() {
		return status.Errorf(codes.FailedPrecondition, "job %s: the video was kept as PNG frames in %s (ffmpeg was missing on the server)", id, path)
	}
	size := st.Size()
	if req.GetOffset() > size {
		v.Add("offset", "must be 0 to %d (the file's size), got %d", size, req.GetOffset())
		return v.Err("GetArtifactRequest")
	}
	off := req.GetOffset()
	buf := make([]byte, ArtifactChunkBytes)
	first := true
	for {
		n, rerr := f.ReadAt(buf, off)
		if n > 0 || first {
			resp := &framepackv1.GetArtifactResponse{Offset: off, Data: buf[:n]}
			if first {
				resp.Name, resp.TotalSize = name, size
				first = false
			}
			if err := stream.Send(resp); err != nil {
				return err
			}
			off += int64(n)
		}
		if rerr == io.EOF || off >= size {
			return nil
		}
		if rerr != nil {
			return status.Errorf(codes.Internal, "job %s: read %s: %v", id, what, rerr)
		}
		if err := stream.Context().Err(); err != nil {
			return statusOf(err)
		}
	}
}

// DeleteJob removes a finished job and its files.
func (s *Server) DeleteJob(_ context.Context, req *framepackv1.DeleteJobRequest) (*framepackv1.DeleteJobResponse, error) {
	id := req.GetJobId()
	if err := requireID(id); err != nil {
		return nil, err
	}
	n, err := s.cfg.Store.Delete(id)
	if errors.Is(err, jobs.ErrNotFinished) {
		state := "queued or running"
		if job, gerr := s.cfg.Store.Get(id); gerr == nil {
			state = stateText(job.GetState())
		}
		return nil, withReason(status.Newf(codes.FailedPrecondition, "job %s has not finished (it is %s); cancel it first", id, state), ReasonJobNotFinished)
	}
	if err != nil {
		return nil, jobStatus(err, id)
	}
	s.log.WithFields(logrus.Fields{"job": id, "freed_bytes": n}).Info("job deleted")
	return &framepackv1.DeleteJobResponse{FreedBytes: n}, nil
}

// admit refuses a job the disk cannot hold: the budget (Config.DiskBudget) counts every job
// directory plus what the unfinished jobs and this one will still write.
func (s *Server) admit(spec *framepackv1.JobSpec, imageBytes int) error {
	if s.cfg.DiskBudget <= 0 && s.cfg.MinFreeBytes <= 0 {
		return nil
	}
	need := jobs.EstimateBytes(spec) + int64(imageBytes)
	pending, err := s.cfg.Store.PendingBytes()
	if err != nil {
		return statusOf(fmt.Errorf("disk budget: %w", err))
	}
	if b := s.cfg.DiskBudget; b > 0 {
		used, err := s.cfg.Store.UsedBytes()
		if err != nil {
			return statusOf(fmt.Errorf("disk budget: %w", err))
		}
		if used+pending+need > b {
			return status.Errorf(codes.ResourceExhausted,
				"job would not fit the disk budget: it needs about %s, the jobs on the server use %s and the unfinished ones will write %s more, the budget (--disk-budget) is %s; delete finished jobs (framepack rm ID), make the video shorter or smaller, or raise the budget",
				FormatBytes(need), FormatBytes(used), FormatBytes(pending), FormatBytes(b))
		}
	}
	if m := s.cfg.MinFreeBytes; m > 0 && s.cfg.FreeBytes != nil {
		free, err := s.cfg.FreeBytes(s.cfg.Store.StateDir())
		if err != nil {
			return statusOf(fmt.Errorf("free disk space: %w", err))
		}
		if int64(free)-pending-need < m {
			return status.Errorf(codes.ResourceExhausted,
				"job would not fit on the disk: it needs about %s, the unfinished jobs will write %s more, %s is free and %s must stay free (--min-free-disk); delete finished jobs (framepack rm ID) or make the video shorter or smaller",
				FormatBytes(need), FormatBytes(pending), FormatBytes(int64(free)), FormatBytes(m))
		}
	}
	return nil
}

// FormatBytes prints n in binary units ("1.5 GiB").
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// FreeBytes returns the bytes an unprivileged user may still write on the file system that
// holds dir (statfs's available blocks).
func FreeBytes(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}
