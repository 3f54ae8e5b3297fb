package jobs_test

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

func pngBytes(t testing.TB, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.RGBA{uint8(x), uint8(y), 100, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// spec is a one-second spec with the defaults the API fills in (window 9, 25 steps).
func spec(prompt string) *framepackv1.JobSpec {
	return &framepackv1.JobSpec{Prompt: prompt, TotalSecondLength: 1, LatentWindowSize: 9, Steps: 25, Cfg: 1, Gs: 10,
		Resolution: 640, UseTeacache: proto.Bool(true), Mp4Crf: proto.Uint32(16), GpuMemoryPreservationGb: proto.Float32(6)}
}

// sections is FramePack's section count, as the pipeline hands it to the queue:
// round(seconds·30 / (window·4)) with halves to even, at least 1.
func sections(s *framepackv1.JobSpec) int {
	return max(1, int(math.RoundToEven(float64(s.GetTotalSecondLength())*30/float64(4*s.GetLatentWindowSize()))))
}

func openStore(t *testing.T, dir string) *jobs.Store {
	t.Helper()
	s, err := jobs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStoreCreateGetList(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	img := pngBytes(t, 8, 8)
	var ids []string
	for i := 0; i < 5; i++ {
		job, err := s.Create(spec(strings.Repeat("x", i+1)), img)
		if err != nil {
			t.Fatal(err)
		}
		if !jobs.ValidID(job.GetId()) || job.GetState() != framepackv1.JobState_JOB_STATE_QUEUED || job.GetCreateTime() == nil {
			t.Fatalf("new job %v", job)
		}
		ids = append(ids, job.GetId())
	}
	// The job directory holds the input byte for byte and a readable spec.
	in, err := s.InputPath(ids[0])
	if err != nil || filepath.Base(in) != "input.png" {
		t.Fatalf("input path %q, %v", in, err)
	}
	if b, err := os.ReadFile(in); err != nil || !bytes.Equal(b, img) {
		t.Fatalf("input image differs: %v", err)
	}
	b, err := os.ReadFile(s.JobDir(ids[0]).Spec())
	if err != nil {
		t.Fatal(err)
	}
	var onDisk framepackv1.JobSpec
	if err := protojson.Unmarshal(b, &onDisk); err != nil || !proto.Equal(&onDisk, spec("x")) {
		t.Fatalf("spec.json %s: %v", b, err)
	}
	for _, d := range []string{s.JobDir(ids[0]).History(), s.JobDir(ids[0]).Videos()} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			t.Fatalf("%s: %v", d, err)
		}
	}

	got, err := s.Get(ids[2])
	if err != nil || got.GetSpec().GetPrompt() != "xxx" {
		t.Fatalf("get: %v %v", got, err)
	}
	if _, err := s.Get("nosuchjob0"); !errors.Is(err, jobs.ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}

	// Pages of two, newest first.
	var listed []string
	token := ""
	for page := 0; ; page++ {
		js, next, err := s.List(jobs.ListOptions{PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range js {
			listed = append(listed, j.GetId())
		}
		if next == "" {
			break
		}
		if page > 5 {
			t.Fatal("no end of pages")
		}
		token = next
	}
	want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
	if strings.Join(listed, ",") != strings.Join(want, ",") {
		t.Fatalf("listed %v, want %v", listed, want)
	}

	// State filter.
	if _, err := s.Update(ids[1], func(j *framepackv1.Job) error {
		j.State = framepackv1.JobState_JOB_STATE_FAILED
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	js, next, err := s.List(jobs.ListOptions{States: []framepackv1.JobState{framepackv1.JobState_JOB_STATE_FAILED}})
	if err != nil || len(js) != 1 || js[0].GetId() != ids[1] || next != "" {
		t.Fatalf("filtered list %v %q %v", js, next, err)
	}
	unf, err := s.Unfinished()
	if err != nil || len(unf) != 4 || unf[0].GetId() != ids[0] {
		t.Fatalf("unfinished %v %v", unf, err)
	}
	for _, tok := range []string{"abc", "0", "-1"} {
		if _, _, err := s.List(jobs.ListOptions{PageToken: tok}); !errors.Is(err, jobs.ErrBadPageToken) {
			t.Errorf("token %q: %v", tok, err)
		}
	}
}

func TestStoreSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := jobs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	job, err := s.Create(spec("a"), pngBytes(t, 4, 4))
	if err != nil {
		t.Fatal(err)
	}
	// A directory with no record (crash between files and record) goes at the next open.
	orphan := filepath.Join(dir, jobs.JobsDirName, "orphan0000")
	if err := os.Mkdir(orphan, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	got, err := s.Get(job.GetId())
	if err != nil || !proto.Equal(got, job) {
		t.Fatalf("after reopen: %v %v", got, err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("orphan dir kept: %v", err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode %v %v", st.Mode(), err)
	}
}

// Concurrent CreateOnce calls with one client request id make one job, and the calls that
// lose leave no job directory behind; a different request with that id is ErrRequestMismatch.
func TestStoreCreateOnceConcurrent(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	img := pngBytes(t, 8, 8)
	sp := spec("once")
	hash, err := jobs.RequestHash(sp, img)
	if err != nil {
		t.Fatal(err)
	}
	req := jobs.ClientRequest{ID: "same-request", Hash: hash}
	const n = 8
	ids := make([]string, n)
	created := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			job, ok, err := s.CreateOnce(req, sp, img)
			ids[i], created[i], errs[i] = job.GetId(), ok, err
		}()
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var made int
	for i, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent CreateOnce with one id gave jobs %v", ids)
		}
		if created[i] {
			made++
		}
	}
	if made != 1 {
		t.Fatalf("%d calls say they created the job, want 1", made)
	}
	entries, err := os.ReadDir(filepath.Join(dir, jobs.JobsDirName))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != ids[0] {
		t.Fatalf("job directories %v, want only %s", entries, ids[0])
	}

	other := jobs.ClientRequest{ID: req.ID, Hash: strings.Repeat("0", len(hash))}
	if job, ok, err := s.CreateOnce(other, spec("another"), img); !errors.Is(err, jobs.ErrRequestMismatch) || ok || job != nil {
		t.Fatalf("same id, other request: %v %v %v; want ErrRequestMismatch", job, ok, err)
	}
	if entries, err := os.ReadDir(filepath.Join(dir, jobs.JobsDirName)); err != nil || len(entries) != 1 {
		t.Fatalf("job directories after a mismatch: %v %v, want 1", entries, err)
	}
}

func TestStoreLocked(t *testing.T) {
	dir := t.TempDir()
	openStore(t, dir)
	if _, err := jobs.Open(dir); !errors.Is(err, jobs.ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
}

func TestStoreCheckpoint(t *testing.T) {
	s := openStore(t, t.TempDir())
	job, err := s.Create(spec("a"), pngBytes(t, 4, 4))
	if err != nil {
		t.Fatal(err)
	}
	id := job.GetId()
	if cp, err := s.Checkpoint(id); err != nil || cp != nil {
		t.Fatalf("fresh job checkpoint %v %v", cp, err)
	}
	d := s.JobDir(id)
	if err := os.WriteFile(filepath.Join(d.History(), "latents.safetensors"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	video := filepath.Join(d.Videos(), "s0.mp4")
	if err := os.WriteFile(video, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cp   jobs.Checkpoint
	}{
		{"section past the end", jobs.Checkpoint{Section: 3, Sections: 3}},
		{"negative section", jobs.Checkpoint{Section: -1, Sections: 3}},
		{"no sections", jobs.Checkpoint{}},
		{"missing file", jobs.Checkpoint{Section: 0, Sections: 3, Files: map[string]string{"latents": "history/nope"}}},
		{"file outside", jobs.Checkpoint{Section: 0, Sections: 3, Files: map[string]string{"latents": "../../jobs.db"}}},
		{"absolute file", jobs.Checkpoint{Section: 0, Sections: 3, Files: map[string]string{"latents": "/etc/passwd"}}},
		{"missing video", jobs.Checkpoint{Section: 0, Sections: 3, VideoPath: video + "x"}},
	} {
		if err := s.SaveCheckpoint(id, tc.cp); !errors.Is(err, jobs.ErrBadCheckpoint) {
			t.Errorf("%s: %v, want ErrBadCheckpoint", tc.name, err)
		}
	}
	want := jobs.Checkpoint{Section: 1, Sections: 3, Files: map[string]string{"latents": "history/latents.safetensors"}, VideoPath: video, FrameCount: 37}
	if err := s.SaveCheckpoint(id, want); err != nil {
		t.Fatal(err)
	}
	cp, err := s.Checkpoint(id)
	if err != nil || cp.Section != 1 || cp.Files["latents"] != "history/latents.safetensors" || cp.VideoPath != video || cp.FrameCount != 37 || cp.Time.IsZero() {
		t.Fatalf("checkpoint %+v %v", cp, err)
	}
	if err := s.SaveCheckpoint("nosuchjob0", jobs.Checkpoint{Section: 0, Sections: 1}); !errors.Is(err, jobs.ErrNotFound) {
		t.Errorf("unknown job: %v", err)
	}
}

func TestStoreEventsAndPartials(t *testing.T) {
	s := openStore(t, t.TempDir())
	job, err := s.Create(spec("a"), pngBytes(t, 4, 4))
	if err != nil {
		t.Fatal(err)
	}
	id := job.GetId()
	for i := uint64(0); i < 3; i++ {
		ev := &framepackv1.JobEvent{JobId: id, Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{Step: uint32(i + 1)}}}
		if err := s.AppendEvent(id, i, ev); err != nil {
			t.Fatal(err)
		}
	}
	evs, next, err := s.Events(id)
	if err != nil || len(evs) != 3 || next != 3 || evs[2].GetSamplingStep().GetStep() != 3 {
		t.Fatalf("events %v next %d %v", evs, next, err)
	}
	if _, _, err := s.Events("nosuchjob0"); !errors.Is(err, jobs.ErrNotFound) {
		t.Errorf("unknown job events: %v", err)
	}
	d := s.JobDir(id)
	keep := filepath.Join(d.Videos(), "a.mp4")
	for _, p := range []string{keep, keep + ".partial", filepath.Join(d.History(), "x.safetensors.partial")} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(d.Videos(), "b.frames.partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	removed, err := s.RemovePartials(id)
	if err != nil || len(removed) != 3 {
		t.Fatalf("removed %v %v", removed, err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("complete file removed: %v", err)
	}
}
