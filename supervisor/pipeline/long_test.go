package pipeline_test

import (
	"bytes"
	"context"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/video"
)

// longSeconds is TestLongJobLinearWrites' video length (make long-cpu: 120).
var longSeconds = flag.Float64("long.seconds", 4, "TestLongJobLinearWrites: the job's length in seconds (10 sections at 4)")

// fileSizes maps every regular file under dir to its size and modification time.
func fileSizes(t *testing.T, dir string) map[string][2]int64 {
	t.Helper()
	out := map[string][2]int64{}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			out[p] = [2]int64{info.Size(), info.ModTime().UnixNano()}
		}
		return nil
	})
	return out
}

// TestLongJobLinearWrites runs a many-section job and measures what each section writes to
// the job's folder (every file new or changed since the last section, at its whole size): the
// history file (its checkpoint) stays the same size whatever the length, each frame is encoded
// once (into its section's segment; the frames still to be blended stay in shared memory) and
// the whole video is joined once at the end, so the bytes written grow linearly with the
// length: the last sections write no more than the first ones. Its video equals, frame for
// frame, the video of the same job keeping every section's history (the old way: whole history
// and whole video after every section).
func TestLongJobLinearWrites(t *testing.T) {
	jc := firstCase(t)
	jc.spec = proto.Clone(jc.spec).(*framepackv1.JobSpec)
	jc.spec.TotalSecondLength, jc.spec.LatentWindowSize, jc.spec.Steps = float32(*longSeconds), 3, 1 // 4 s: 10 sections
	workers := buildWorkers(t)
	o := newOpts(t, workers)
	o.KeepHistory, o.NoPreviews, o.Residency, o.DeviceMemory = false, true, true, residencyMemory
	d, err := newDaemon(o, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	ctx, cancel := context.WithTimeout(t.Context(), 2*jobTimeout+time.Duration(*longSeconds*float64(30*time.Second)))
	defer cancel()
	c := client(t, o.Socket)
	resp, err := c.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: jc.image, Spec: jc.spec})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJob().GetId()
	dir := filepath.Join(o.State, "jobs", id)
	seen := fileSizes(t, dir)
	var perSection, histSizes []int64
	var total, other int64
	last, err := watch(ctx, c, id, func(ev *framepackv1.JobEvent) bool {
		if ev.GetSectionVideo() == nil {
			return true
		}
		now := fileSizes(t, dir)
		var n int64
		for p, st := range now {
			if old, ok := seen[p]; (!ok || old != st) && !strings.HasSuffix(p, ".jsonl") && !strings.HasSuffix(p, ".db") {
				n += st[0]
				if strings.Contains(p, string(filepath.Separator)+"history"+string(filepath.Separator)+"section-") {
					histSizes = append(histSizes, st[0])
				} else {
					other += st[0]
				}
			}
		}
		seen = now
		perSection = append(perSection, n)
		total += n
		return true
	})
	if err != nil || last.GetJobFinished() == nil {
		t.Fatalf("job: %v %v", last, err)
	}
	sections := int(last.GetJobFinished().GetResult().GetFrameCount())
	if len(perSection) < 8 {
		t.Fatalf("%d sections, want a long job", len(perSection))
	}
	kept := fileSizes(t, dir)
	var keptBytes, videoBytes int64
	for p, st := range kept {
		if !strings.HasSuffix(p, ".jsonl") {
			keptBytes += st[0]
		}
		if strings.Contains(p, string(filepath.Separator)+"video"+string(filepath.Separator)) {
			videoBytes += st[0]
		}
	}
	n := len(perSection)
	// The first and last section write the most (the first has no segment, the last joins
	// the video); compare the steady ones: the second half against the first.
	var early, late int64
	for i := 1; i < n/2; i++ {
		early = max(early, perSection[i])
	}
	for i := n / 2; i < n-1; i++ {
		late = max(late, perSection[i])
	}
	t.Logf("%d sections, %d frames: bytes written per section %v; %d in all, %d kept", n, sections, perSection, total, keptBytes)
	if late > early+early/2 {
		t.Errorf("later sections write more than the early ones (%d against %d): the writes grow with the length", late, early)
	}
	t.Logf("history files %v; video and other files %d bytes written, the video kept %d", histSizes, other, videoBytes)
	// The same size but for the segment list in its metadata (a few bytes a section).
	if len(histSizes) != n || histSizes[n-2]-histSizes[1] > int64(n)*64 {
		t.Errorf("history file sizes %v: want one per section, the same size but for a few bytes of segment names", histSizes)
	}
	// Each frame is encoded into its segment once and the segments joined once, besides the
	// small settings and parts files of each section.
	if other > 2*videoBytes+int64(n)*16<<10 {
		t.Errorf("the job wrote %d bytes of video and other files for a %d-byte video: more than each frame encoded and joined once", other, videoBytes)
	}
	if _, err := os.Stat(filepath.Join(dir, "video", "segments")); !os.IsNotExist(err) {
		t.Errorf("segments left after the job: %v", err)
	}

	// The same job keeping every section's history: same frames.
	ok := newOpts(t, workers)
	ok.NoPreviews = true
	d2, err := newDaemon(ok, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Kill()
	job2, _ := runJob(t, jc, ok.Socket)
	a, err := (&video.Writer{}).ReadFrames(ctx, last.GetJobFinished().GetResult().GetVideoPath())
	if err != nil {
		t.Fatal(err)
	}
	b, err := (&video.Writer{}).ReadFrames(ctx, job2.GetResult().GetVideoPath())
	if err != nil {
		t.Fatal(err)
	}
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Fatalf("the linear job's video (%d bytes of frames) differs from the whole-history job's (%d)", len(a), len(b))
	}
}

// TestPNGFramesWithoutFFmpeg runs a three-section job on a daemon without ffmpeg (as on a
// machine where it is not installed): every section's video is a folder of PNG frames, the
// checkpoint after each section names the video so far by its MP4 name (its parts file is
// written beside that name, its frames are joined into the .frames folder at the end), and
// the job's video holds one PNG per frame, the same frames as the same job keeping every
// section's history.
func TestPNGFramesWithoutFFmpeg(t *testing.T) {
	jc := firstCase(t)
	jc.spec = proto.Clone(jc.spec).(*framepackv1.JobSpec)
	jc.spec.TotalSecondLength, jc.spec.LatentWindowSize, jc.spec.Steps = 1.2, 3, 1 // 3 sections
	workers := buildWorkers(t)
	var results []*framepackv1.JobResult
	for _, keepHistory := range []bool{false, true} {
		o := newOpts(t, workers)
		o.KeepHistory, o.NoPreviews, o.NoFFmpeg = keepHistory, true, true
		d, err := newDaemon(o, testLogger())
		if err != nil {
			t.Fatal(err)
		}
		job, evs := runJob(t, jc, o.Socket)
		d.Kill()
		sections := 0
		for _, ev := range evs {
			if ev.GetSectionVideo() != nil {
				sections++
			}
		}
		res := job.GetResult()
		if sections < 3 {
			t.Fatalf("%d sections, want 3", sections)
		}
		if !strings.HasSuffix(res.GetVideoPath(), video.FramesDirExt) {
			t.Fatalf("video %q: want a PNG frames folder", res.GetVideoPath())
		}
		pngs, err := filepath.Glob(filepath.Join(res.GetVideoPath(), "*.png"))
		if err != nil || len(pngs) != int(res.GetFrameCount()) || len(pngs) == 0 {
			t.Fatalf("%d PNG files for %d frames (%v)", len(pngs), res.GetFrameCount(), err)
		}
		results = append(results, res)
	}
	ctx := t.Context()
	a, err := (&video.Writer{}).ReadFrames(ctx, results[0].GetVideoPath())
	if err != nil {
		t.Fatal(err)
	}
	b, err := (&video.Writer{}).ReadFrames(ctx, results[1].GetVideoPath())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatalf("the PNG job's frames (%d bytes) differ from the whole-history job's (%d)", len(a), len(b))
	}
}
