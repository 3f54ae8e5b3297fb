package api

import (
	"context"
	"slices"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"google.golang.org/protobuf/proto"
)

// ModelFit is what the API asks of the models the server serves (pipeline.ModelInfo), so that
// every client gets the same defaults and the same refusals at submit.
type ModelFit interface {
	// NativeResolution is the resolution (a table plan.KnownTable knows) that a job naming
	// none runs at.
	NativeResolution() uint32
	// FitResolution says why the models cannot take a job fitted to the server's bucket
	// table for resolution (640 on the tiny test models: minutes a section on a CPU for a
	// size they were not made for); nil when they can, or when no table has that name.
	FitResolution(resolution uint32) error
}

// models returns what the served models take; nil means FramePack's full-size models.
func (s *Server) models() ModelFit {
	if s.cfg.Models == nil {
		return nil
	}
	return s.cfg.Models()
}

// withDefaults returns a copy of spec with every default filled in (jobs.WithDefaults), the
// resolution being the served models' own when spec names neither a resolution nor buckets.
func (s *Server) withDefaults(spec *framepackv1.JobSpec) *framepackv1.JobSpec {
	out := jobs.WithDefaults(spec)
	if m := s.models(); m != nil && spec.GetResolution() == 0 && len(spec.GetBuckets()) == 0 {
		out.Resolution = m.NativeResolution()
	}
	return out
}

// checkFit refuses a job (spec with its defaults) whose bucket table the served models do not
// take; a job with its own buckets knows its sizes and is not judged.
func (s *Server) checkFit(spec *framepackv1.JobSpec) error {
	m := s.models()
	if m == nil || len(spec.GetBuckets()) > 0 {
		return nil
	}
	return m.FitResolution(spec.GetResolution())
}

// GetJobDefaults returns the JobSpec a job leaving every optional field unset gets on this
// server, and the bucket tables it knows (the default first), each saying whether the served
// models take it.
func (s *Server) GetJobDefaults(context.Context, *framepackv1.GetJobDefaultsRequest) (*framepackv1.GetJobDefaultsResponse, error) {
	spec := s.withDefaults(&framepackv1.JobSpec{})
	spec.EndStrength = proto.Float32(jobs.DefaultEndStrength) // filled in only with an end image
	resp := &framepackv1.GetJobDefaultsResponse{Spec: spec}
	m := s.models()
	for _, r := range plan.KnownResolutions() {
		table, _ := plan.KnownTable(r)
		opt := &framepackv1.ResolutionOption{Resolution: uint32(r), Label: plan.TableLabel(r)}
		for _, b := range table {
			opt.Buckets = append(opt.Buckets, &framepackv1.Bucket{Height: uint32(b.Height), Width: uint32(b.Width)})
		}
		if m != nil {
			if err := m.FitResolution(uint32(r)); err != nil {
				opt.UnavailableReason = err.Error()
			}
		}
		resp.Resolutions = append(resp.Resolutions, opt)
	}
	// The default first, then the table order.
	slices.SortStableFunc(resp.Resolutions, func(a, b *framepackv1.ResolutionOption) int {
		switch {
		case a.GetResolution() == spec.GetResolution():
			return -1
		case b.GetResolution() == spec.GetResolution():
			return 1
		}
		return 0
	})
	return resp, nil
}
