package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The CLI's exit 8 (frames saved as PNG, no ffmpeg on the server) is a finished job with a
// note; any other failure is the job's error; success is neither.
func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		code           string
		note, errSub   string
		wantNote, want bool
	}{
		{code: "0"},
		{code: "8", note: "frames saved as PNG: saved 37 frames", wantNote: true},
		{code: "3", errSub: "exit status 3", want: true},
	} {
		err := exec.Command("sh", "-c", "exit "+tc.code).Run()
		note, msg := outcome(err, "progress\nsaved 37 frames")
		if tc.wantNote != (note != "") || (tc.wantNote && note != tc.note) {
			t.Errorf("exit %s: note %q, want %q", tc.code, note, tc.note)
		}
		if tc.want != (msg != "") || !strings.Contains(msg, tc.errSub) {
			t.Errorf("exit %s: error %q, want one containing %q: %v", tc.code, msg, tc.errSub, tc.want)
		}
	}
}

// The caches a job leaves in its state folder reach the next job's; a missing one is skipped.
func TestCopyCaches(t *testing.T) {
	from, to := t.TempDir(), filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(filepath.Join(from, cacheFiles[0]), []byte(`{"decisions":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := copyCaches(from, to); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(to, cacheFiles[0]))
	if err != nil || string(got) != `{"decisions":1}` {
		t.Fatalf("copied %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(to, cacheFiles[1])); !os.IsNotExist(err) {
		t.Fatalf("a cache that did not exist was written: %v", err)
	}
}
