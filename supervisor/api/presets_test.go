package api_test

import (
	"path/filepath"
	"strings"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestPresets saves, lists, reads and deletes presets over gRPC, refuses bad ones on the field,
// and submits jobs that name one: the preset fills what the job leaves unset, the job's own
// settings win, the stored spec names the preset, and a repeat of a client request id is the
// same job even after the preset changed.
func TestPresets(t *testing.T) {
	dir := shortDir(t)
	td := startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "s.sock"), []string{"cpu"}, holdRunner)
	presets := framepackv1.NewPresetServiceClient(td.conn)
	ctx := t.Context()

	fast := &framepackv1.Preset{Name: "fast mag", Spec: &framepackv1.JobSpec{Steps: 12, Cache: "magcache",
		MagcacheThreshold: proto.Float64(0.2), Gs: 8, NegativePrompt: "blurry", Loras: nil}}
	saved, err := presets.SavePreset(ctx, &framepackv1.SavePresetRequest{Preset: fast})
	if err != nil {
		t.Fatal(err)
	}
	if saved.GetPreset().GetUpdateTime() == nil || saved.GetPreset().GetSpec().GetSteps() != 12 {
		t.Fatalf("saved %v", saved.GetPreset())
	}
	for _, tc := range []struct {
		name    string
		preset  *framepackv1.Preset
		field   string
		message string
	}{
		{"no name", &framepackv1.Preset{Spec: &framepackv1.JobSpec{Steps: 3}}, "preset.name", "required"},
		{"bad name", &framepackv1.Preset{Name: "a/b", Spec: &framepackv1.JobSpec{Steps: 3}}, "preset.name", `character '/'`},
		{"no spec", &framepackv1.Preset{Name: "x"}, "preset.spec", "required"},
		{"bad steps", &framepackv1.Preset{Name: "x", Spec: &framepackv1.JobSpec{Steps: 200}}, "preset.spec.steps", "1 to 100"},
		{"image", &framepackv1.Preset{Name: "x", Spec: &framepackv1.JobSpec{EndImage: pngImage(t, 8, 8)}}, "preset.spec.end_image", "not this"},
		{"lane", &framepackv1.Preset{Name: "x", Spec: &framepackv1.JobSpec{Lane: "cpu"}}, "preset.spec.lane", "not this"},
		{"bad cache", &framepackv1.Preset{Name: "x", Spec: &framepackv1.JobSpec{Cache: "nope"}}, "preset.spec.cache", "unknown cache"},
	} {
		_, err := presets.SavePreset(ctx, &framepackv1.SavePresetRequest{Preset: tc.preset})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.field+": ") || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT on %s saying %q", tc.name, err, tc.field, tc.message)
		}
	}
	if _, err := presets.SavePreset(ctx, &framepackv1.SavePresetRequest{Preset: &framepackv1.Preset{Name: "b", Spec: &framepackv1.JobSpec{Seed: proto.Int64(5)}}}); err != nil {
		t.Fatal(err)
	}
	list, err := presets.ListPresets(ctx, &framepackv1.ListPresetsRequest{})
	if err != nil || len(list.GetPresets()) != 2 || list.GetPresets()[0].GetName() != "b" || list.GetPresets()[1].GetName() != "fast mag" {
		t.Fatalf("list %v %v, want b and fast mag, by name", list.GetPresets(), err)
	}

	// A job naming the preset: its own steps win, the rest comes from the preset.
	spec := baseSpec()
	spec.Preset, spec.Steps = "fast mag", 20
	job := td.submit(t, spec)
	got := job.GetSpec()
	if got.GetPreset() != "fast mag" || got.GetSteps() != 20 || got.GetCache() != "magcache" || got.GetMagcacheThreshold() != 0.2 ||
		got.GetGs() != 8 || got.GetNegativePrompt() != "blurry" || got.GetMagcacheMaxConsecutiveSkips() != 2 {
		t.Errorf("job spec from the preset: %v", got)
	}
	// A repeat of a client request id is the same job, also after the preset changed.
	spec2 := baseSpec()
	spec2.Preset, spec2.Steps = "fast mag", 0 // the preset's 12 steps
	first, err := submitOnce(ctx, td, "preset-req", pngImage(t, 40, 30), spec2)
	if err != nil {
		t.Fatal(err)
	}
	fast.Spec.Steps = 30
	if _, err := presets.SavePreset(ctx, &framepackv1.SavePresetRequest{Preset: fast}); err != nil {
		t.Fatal(err)
	}
	again, err := submitOnce(ctx, td, "preset-req", pngImage(t, 40, 30), spec2)
	if err != nil || again.GetId() != first.GetId() || again.GetSpec().GetSteps() != 12 {
		t.Errorf("repeat after the preset changed: %v %v (first %s)", again, err, first.GetId())
	}
	// An unknown preset is refused on the field.
	spec3 := baseSpec()
	spec3.Preset = "nope"
	if _, err := td.jobs.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: pngImage(t, 40, 30), Spec: spec3}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), `spec.preset: no preset "nope"`) {
		t.Errorf("unknown preset: %v", err)
	}

	if p, err := presets.GetPreset(ctx, &framepackv1.GetPresetRequest{Name: "fast mag"}); err != nil || p.GetPreset().GetSpec().GetSteps() != 30 {
		t.Errorf("get: %v %v", p, err)
	}
	if _, err := presets.DeletePreset(ctx, &framepackv1.DeletePresetRequest{Name: "fast mag"}); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		func() error {
			_, err := presets.GetPreset(ctx, &framepackv1.GetPresetRequest{Name: "fast mag"})
			return err
		}(),
		func() error {
			_, err := presets.DeletePreset(ctx, &framepackv1.DeletePresetRequest{Name: "fast mag"})
			return err
		}(),
	} {
		if status.Code(err) != codes.NotFound {
			t.Errorf("deleted preset: %v, want NOT_FOUND", err)
		}
	}
	// The job that named it keeps its settings and the name.
	if j, err := td.jobs.GetJob(ctx, &framepackv1.GetJobRequest{JobId: job.GetId()}); err != nil || j.GetJob().GetSpec().GetPreset() != "fast mag" {
		t.Errorf("job after its preset was deleted: %v %v", j, err)
	}
}
