package main

import (
	"strings"
	"testing"
)

// TestCLIPresets saves, lists, shows and removes presets with the CLI against a real daemon, and
// submits a job with --preset: the flags given override the preset, the rest comes from it, and
// the job records the preset.
func TestCLIPresets(t *testing.T) {
	f := setup(t)
	r := f.cli(t, "presets", "save", "fast", "--steps", "12", "--cache", "magcache", "--magcache-threshold", "0.2", "--negative-prompt", "blurry face")
	if r.code != exitOK || !strings.Contains(r.stdout, `saved preset "fast"`) || !strings.Contains(r.stdout, "steps=12") ||
		!strings.Contains(r.stdout, "cache=magcache") || !strings.Contains(r.stdout, `negative_prompt="blurry face"`) || strings.Contains(r.stdout, "seed=") {
		t.Fatalf("save: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := f.cli(t, "presets", "save", "empty"); r.code != exitUsage || !strings.Contains(r.stderr, "no settings given") {
		t.Errorf("save without settings: exit %d %s", r.code, r.stderr)
	}
	if r := f.cli(t, "presets", "save", "bad/name", "--steps", "3"); r.code != exitRejected || !strings.Contains(r.stderr, "preset.name") {
		t.Errorf("bad name: exit %d %s", r.code, r.stderr)
	}
	if r := f.cli(t, "presets", "save", "many", "--steps", "300"); r.code != exitRejected || !strings.Contains(r.stderr, "preset.spec.steps") {
		t.Errorf("bad steps: exit %d %s", r.code, r.stderr)
	}
	r = f.cli(t, "presets", "list")
	if r.code != exitOK || !strings.Contains(r.stdout, "NAME") || !strings.Contains(r.stdout, "fast") {
		t.Errorf("list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = f.cli(t, "presets", "show", "fast")
	if r.code != exitOK || !strings.Contains(r.stdout, `"magcacheThreshold": 0.2`) {
		t.Errorf("show: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = f.cli(t, "generate", "--image", f.image, "--prompt", "a cat", "--preset", "fast", "--steps", "5", "--seconds", "1", "--detach")
	if r.code != exitOK {
		t.Fatalf("generate --preset: exit %d %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	job, err := f.d.Store().Get(id)
	if err != nil {
		t.Fatal(err)
	}
	s := job.GetSpec()
	if s.GetPreset() != "fast" || s.GetSteps() != 5 || s.GetCache() != "magcache" || s.GetMagcacheThreshold() != 0.2 ||
		s.GetNegativePrompt() != "blurry face" || s.GetTotalSecondLength() != 1 || s.GetSeed() != 0 {
		t.Errorf("job from the preset: %v", s)
	}
	if r := f.cli(t, "generate", "--image", f.image, "--prompt", "a cat", "--preset", "nope", "--detach"); r.code != exitRejected ||
		!strings.Contains(r.stderr, `--preset (spec.preset): no preset "nope"`) {
		t.Errorf("unknown preset: exit %d %s", r.code, r.stderr)
	}
	if r := f.cli(t, "presets", "rm", "fast"); r.code != exitOK {
		t.Errorf("rm: exit %d %s", r.code, r.stderr)
	}
	if r := f.cli(t, "presets", "show", "fast"); r.code != exitNotFound {
		t.Errorf("show after rm: exit %d %s", r.code, r.stderr)
	}
}
