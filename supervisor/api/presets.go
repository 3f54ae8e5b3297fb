package api

import (
	"context"
	"errors"
	"fmt"
	"strings"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// PresetStore keeps presets (jobs.Store does).
type PresetStore interface {
	SavePreset(p *framepackv1.Preset) (*framepackv1.Preset, error)
	Preset(name string) (*framepackv1.Preset, error)
	Presets() ([]*framepackv1.Preset, error)
	DeletePreset(name string) error
}

// errNoPresets answers a preset call on a server that keeps none.
var errNoPresets = status.Error(codes.FailedPrecondition, "this server keeps no presets (a cluster's daemons do not share them yet): give the settings in the job")

// presets returns the server's preset store, or errNoPresets.
func (s *Server) presets() (PresetStore, error) {
	if s.cfg.Presets == nil {
		return nil, errNoPresets
	}
	return s.cfg.Presets, nil
}

// withPreset returns req with the settings of the preset its spec names filled in
// (jobs.ApplyPreset); req itself when it names none. An unknown preset is INVALID_ARGUMENT on
// spec.preset.
func (s *Server) withPreset(req *framepackv1.SubmitJobRequest) (*framepackv1.SubmitJobRequest, error) {
	name := req.GetSpec().GetPreset()
	if name == "" {
		return req, nil
	}
	store, err := s.presets()
	if err != nil {
		return nil, err
	}
	p, err := store.Preset(name)
	if errors.Is(err, jobs.ErrPresetNotFound) {
		var v Violations
		v.Add("spec.preset", "no preset %q on this server (framepack presets list, or GET /v1/presets)", name)
		return nil, v.Err("SubmitJobRequest")
	}
	if err != nil {
		return nil, statusOf(err)
	}
	out := proto.Clone(req).(*framepackv1.SubmitJobRequest)
	out.Spec = jobs.ApplyPreset(req.GetSpec(), p)
	return out, nil
}

// checkPreset checks a preset to save: its name, and its settings as SubmitJob would check
// them, without the fields a preset cannot hold (images, lane, preset).
func (s *Server) checkPreset(p *framepackv1.Preset) Violations {
	var v Violations
	if err := jobs.CheckPresetName(p.GetName()); err != nil {
		v.Add("preset.name", "%v", err)
	}
	spec := p.GetSpec()
	if spec == nil {
		v.Add("preset.spec", "required: the preset's settings")
		return v
	}
	for _, f := range presetForbidden(spec) {
		v.Add("preset.spec."+f, "a preset holds settings, not this: give it with each job")
	}
	// The settings themselves, as a job's: a placeholder prompt and length where the preset
	// leaves them to the job, the image left out.
	check := proto.Clone(spec).(*framepackv1.JobSpec)
	if check.GetPrompt() == "" {
		check.Prompt = "-"
	}
	if check.GetTotalSecondLength() == 0 {
		check.TotalSecondLength = 1
	}
	check.Lane, check.Preset = "", ""
	for _, fv := range validateSubmit(&framepackv1.SubmitJobRequest{Image: []byte{0}, Spec: check}, nil, func([]byte) (int, int, error) { return 1, 1, nil }) {
		if strings.HasPrefix(fv.GetField(), "spec.") {
			v.Add("preset."+fv.GetField(), "%s", fv.GetDescription())
		}
	}
	checkVariant(&v, spec.GetVariant(), s.cfg.CheckVariant)
	for i, fv := range v {
		if fv.GetField() == "spec.variant" {
			v[i].Field = "preset.spec.variant"
		}
	}
	return v
}

// presetForbidden lists the fields of spec a preset may not set.
func presetForbidden(spec *framepackv1.JobSpec) []string {
	var out []string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"end_image", len(spec.GetEndImage()) > 0}, {"end_image_sha256", spec.GetEndImageSha256() != ""},
		{"lane", spec.GetLane() != ""}, {"preset", spec.GetPreset() != ""}, {"batch_id", spec.GetBatchId() != ""},
		{"keyframes", len(spec.GetKeyframes()) > 0}, {"input_video", len(spec.GetInputVideo()) > 0},
		{"input_video_job_id", spec.GetInputVideoJobId() != ""},
	} {
		if f.set {
			out = append(out, f.name)
		}
	}
	return out
}

// SavePreset stores a preset.
func (s *Server) SavePreset(_ context.Context, req *framepackv1.SavePresetRequest) (*framepackv1.SavePresetResponse, error) {
	if req.GetPreset() == nil {
		var v Violations
		v.Add("preset", "required: a name and settings")
		return nil, v.Err("SavePresetRequest")
	}
	if err := s.checkPreset(req.GetPreset()).Err("SavePresetRequest"); err != nil {
		return nil, err
	}
	store, err := s.presets()
	if err != nil {
		return nil, err
	}
	p, err := store.SavePreset(req.GetPreset())
	if err != nil {
		return nil, statusOf(err)
	}
	s.log.WithField("preset", p.GetName()).Info("preset saved")
	return &framepackv1.SavePresetResponse{Preset: p}, nil
}

// GetPreset returns one preset.
func (s *Server) GetPreset(_ context.Context, req *framepackv1.GetPresetRequest) (*framepackv1.GetPresetResponse, error) {
	store, err := s.presets()
	if err != nil {
		return nil, err
	}
	p, err := store.Preset(req.GetName())
	if err != nil {
		return nil, presetStatus(err, req.GetName())
	}
	return &framepackv1.GetPresetResponse{Preset: p}, nil
}

// ListPresets returns every preset.
func (s *Server) ListPresets(context.Context, *framepackv1.ListPresetsRequest) (*framepackv1.ListPresetsResponse, error) {
	store, err := s.presets()
	if err != nil {
		return nil, err
	}
	ps, err := store.Presets()
	if err != nil {
		return nil, statusOf(err)
	}
	return &framepackv1.ListPresetsResponse{Presets: ps}, nil
}

// DeletePreset removes a preset.
func (s *Server) DeletePreset(_ context.Context, req *framepackv1.DeletePresetRequest) (*framepackv1.DeletePresetResponse, error) {
	store, err := s.presets()
	if err != nil {
		return nil, err
	}
	if err := store.DeletePreset(req.GetName()); err != nil {
		return nil, presetStatus(err, req.GetName())
	}
	s.log.WithFields(logrus.Fields{"preset": req.GetName()}).Info("preset deleted")
	return &framepackv1.DeletePresetResponse{}, nil
}

// presetStatus is statusOf for a call about a named preset.
func presetStatus(err error, name string) error {
	if errors.Is(err, jobs.ErrPresetNotFound) {
		return status.Error(codes.NotFound, fmt.Sprintf("no preset %q", name))
	}
	return statusOf(err)
}
