package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
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
		s.GetNegativePrompt() != "blurry face" || s.GetTotalSecondLength() != 1 || s.GetSeed() != plan.DefaultSeed {
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

// TestCLIBatch runs batches with the CLI against a real daemon (fake runs that write real MP4s):
// a folder of images followed to its end with the videos saved; the same batch again adds no
// job; a CSV with per-row settings and a JSONL file; a bad row refused with its line; status
// and cancel by batch id.
func TestCLIBatch(t *testing.T) {
	f := setup(t)
	img, err := os.ReadFile(f.image)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(f.dir, "photos")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"b.png", "a.png", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, n), img, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(f.dir, "videos")
	r := f.cli(t, "batch", dir, "--prompt", "a cat walks", "--seconds", "1.2", "--steps", "2", "--out-dir", out)
	if r.code != exitOK {
		t.Fatalf("batch of a folder: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"1/2 " + filepath.Join(dir, "a.png"), "2/2 " + filepath.Join(dir, "b.png"), "batch b-photos-", "finished"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	for _, v := range []string{"a.mp4", "b.mp4"} {
		if st, err := os.Stat(filepath.Join(out, v)); err != nil || st.Size() == 0 {
			t.Errorf("saved video %s: %v", v, err)
		}
	}
	list, _, err := f.d.Store().List(jobs.ListOptions{PageSize: 100})
	if err != nil || len(list) != 2 {
		t.Fatalf("%d jobs after the folder batch, want 2 (%v)", len(list), err)
	}
	batchID := list[0].GetSpec().GetBatchId()
	if !strings.HasPrefix(batchID, "b-photos-") || list[1].GetSpec().GetBatchId() != batchID || list[0].GetSpec().GetSteps() != 2 {
		t.Fatalf("batch jobs: %v / %v", list[0].GetSpec(), list[1].GetSpec())
	}
	// The same batch again: no new job.
	if r := f.cli(t, "batch", dir, "--prompt", "a cat walks", "--seconds", "1.2", "--steps", "2", "--detach"); r.code != exitOK || strings.TrimSpace(r.stdout) != batchID {
		t.Fatalf("repeat: exit %d %q\n%s", r.code, r.stdout, r.stderr)
	}
	if list, _, _ := f.d.Store().List(jobs.ListOptions{PageSize: 100}); len(list) != 2 {
		t.Errorf("%d jobs after repeating the batch, want 2", len(list))
	}
	r = f.cli(t, "batch", "status", batchID)
	if r.code != exitOK || !strings.Contains(r.stdout, "2 jobs: 0 queued, 0 running, 2 succeeded") {
		t.Errorf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A CSV: per-row prompt and steps, paths relative to the file; a JSONL file the same.
	csvPath := filepath.Join(dir, "jobs.csv")
	if err := os.WriteFile(csvPath, []byte("image,prompt,steps,cache\na.png,block one,,\nb.png,block two,4,magcache\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = f.cli(t, "batch", csvPath, "--seconds", "1", "--steps", "3", "--batch-id", "csv-1", "--detach")
	if r.code != exitOK || strings.TrimSpace(r.stdout) != "csv-1" {
		t.Fatalf("csv batch: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	f.waitBlocked(t)
	got := map[string]*framepackv1.JobSpec{}
	list, _, _ = f.d.Store().List(jobs.ListOptions{PageSize: 100})
	for _, j := range list {
		if j.GetSpec().GetBatchId() == "csv-1" {
			got[j.GetSpec().GetPrompt()] = j.GetSpec()
		}
	}
	if s := got["block one"]; s == nil || s.GetSteps() != 3 || s.GetCache() != "teacache" || s.GetImageFilename() != "a.png" {
		t.Errorf("csv row 1: %v", s)
	}
	if s := got["block two"]; s == nil || s.GetSteps() != 4 || s.GetCache() != "magcache" {
		t.Errorf("csv row 2: %v", s)
	}
	r = f.cli(t, "batch", "cancel", "csv-1")
	if r.code != exitOK || !strings.Contains(r.stdout, "batch csv-1: 2 jobs") {
		t.Errorf("cancel: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	jsonl := filepath.Join(dir, "jobs.jsonl")
	if err := os.WriteFile(jsonl, []byte(`{"image": "a.png", "prompt": "a dog", "seed": 5}`+"\n\n"+`{"image": "b.png", "prompt": "a dog", "steps": 500}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = f.cli(t, "batch", jsonl, "--seconds", "1", "--detach")
	if r.code != exitRejected || !strings.Contains(r.stderr, "jobs.jsonl line 3") || !strings.Contains(r.stderr, "--steps (spec.steps)") {
		t.Errorf("jsonl with a bad line: exit %d\n%s", r.code, r.stderr)
	}
	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("image,colour\na.png,red\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := f.cli(t, "batch", bad, "--prompt", "p", "--detach"); r.code != exitUsage || !strings.Contains(r.stderr, "bad.csv line 2") || !strings.Contains(r.stderr, "colour") {
		t.Errorf("unknown column: exit %d\n%s", r.code, r.stderr)
	}
}

// TestCLIKeyframes submits keyframes by section and by time with the CLI: the stored spec holds
// each keyframe's section or time and hash, the server keeps the images, and bad flags are
// refused with what to write.
func TestCLIKeyframes(t *testing.T) {
	f := setup(t)
	r := f.cli(t, "generate", "--image", f.image, "--prompt", "a cat", "--seconds", "2.4", "--window", "3", "--keyframe", "1:"+f.image,
		"--keyframe", "0.5s:"+f.image, "--detach")
	if r.code != exitOK {
		t.Fatalf("generate with keyframes: exit %d %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	job, err := f.d.Store().Get(id)
	if err != nil {
		t.Fatal(err)
	}
	ks := job.GetSpec().GetKeyframes()
	if len(ks) != 2 || ks[0].GetSection() != 1 || ks[1].GetSeconds() != 0.5 || len(ks[0].GetImageSha256()) != 64 || len(ks[1].GetImage()) != 0 {
		t.Fatalf("stored keyframes %v", ks)
	}
	paths, _, err := f.d.Store().ExtraInputs(id)
	if err != nil || len(paths) != 2 {
		t.Fatalf("keyframe files %v %v", paths, err)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Error(err)
		}
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--keyframe", "x:" + f.image}, exitUsage, "want a section number"},
		{[]string{"--keyframe", "2"}, exitUsage, "want SECTION:PATH"},
		{[]string{"--keyframe", "9:" + f.image}, exitRejected, "--keyframe (spec.keyframes): keyframes[0]: section 9"},
		{[]string{"--keyframe", "1:" + f.image, "--variant", "f1"}, exitRejected, "takes no keyframes"},
	} {
		args := append([]string{"generate", "--image", f.image, "--prompt", "a cat", "--seconds", "2.4", "--window", "3", "--detach"}, tc.args...)
		if r := f.cli(t, args...); r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %s; want exit %d saying %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
}

// TestCLIVideo submits a video extension with the CLI: the server checks the video (ffprobe) and
// keeps it, the spec records its hash and settings; an image with a video, or video settings
// without one, are refused before anything is sent, and a video that is no video by the server.
func TestCLIVideo(t *testing.T) {
	if _, err := exec.LookPath("ffprobe"); err != nil {
		t.Skip("no ffprobe (make setup installs ffmpeg)")
	}
	f := setup(t)
	vid := filepath.Join(f.dir, "in.mp4")
	if out, err := exec.Command("ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc=size=64x48:rate=30", "-frames:v", "12",
		"-pix_fmt", "yuv420p", vid).CombinedOutput(); err != nil {
		t.Fatalf("make a test video: %v %s", err, out)
	}
	r := f.cli(t, "generate", "--input-video", vid, "--prompt", "a cat", "--seconds", "1", "--video-context-frames", "3",
		"--video-include-input=false", "--detach")
	if r.code != exitOK {
		t.Fatalf("generate --input-video: exit %d %s", r.code, r.stderr)
	}
	job, err := f.d.Store().Get(strings.TrimSpace(r.stdout))
	if err != nil {
		t.Fatal(err)
	}
	s := job.GetSpec()
	if len(s.GetInputVideoSha256()) != 64 || len(s.GetInputVideo()) != 0 || s.GetVideoContextFrames() != 3 || s.GetVideoIncludeInput() {
		t.Errorf("stored spec %v", s)
	}
	if _, p, err := f.d.Store().ExtraInputs(job.GetId()); err != nil || !strings.HasSuffix(p, "input-video.mp4") {
		t.Errorf("kept video %q %v", p, err)
	}
	junk := filepath.Join(f.dir, "junk.mp4")
	if err := os.WriteFile(junk, []byte("no video here at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--input-video", vid, "--image", f.image}, exitUsage, "takes no --image"},
		{[]string{"--image", f.image, "--video-context-frames", "3"}, exitUsage, "--video-context-frames needs --input-video"},
		{[]string{"--input-video", junk}, exitRejected, "--input-video (spec.input_video): bad video: ffprobe cannot read it"},
		{[]string{"--extend-job", "nosuchjob00"}, exitRejected, `--extend-job (spec.input_video_job_id): no job "nosuchjob00"`},
	} {
		args := append([]string{"generate", "--prompt", "a cat", "--seconds", "1", "--detach"}, tc.args...)
		if r := f.cli(t, args...); r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %s; want exit %d saying %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
}
