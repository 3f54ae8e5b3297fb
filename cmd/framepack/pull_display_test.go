package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/hfhub"
)

func pullEvents() []hfhub.Progress {
	const a, b = "org/r", "org/r"
	return []hfhub.Progress{
		{Repo: a, Path: "big.safetensors", State: hfhub.FileQueued, Size: 4 << 20, Total: 5 << 20, Files: 2},
		{Repo: b, Path: "small.json", State: hfhub.FileQueued, Size: 1 << 20, Total: 5 << 20, Files: 2},
		{Repo: a, Path: "big.safetensors", State: hfhub.FileDownloading, Done: 2 << 20, Size: 4 << 20, TotalDone: 2 << 20, Total: 5 << 20, Files: 2},
		{Repo: a, Path: "big.safetensors", State: hfhub.FileDone, Done: 4 << 20, Size: 4 << 20, TotalDone: 4 << 20, Total: 5 << 20, FilesDone: 1, Files: 2},
		{Repo: b, Path: "small.json", State: hfhub.FileDownloading, Done: 1, Size: 1 << 20, TotalDone: 4<<20 + 1, Total: 5 << 20, FilesDone: 1, Files: 2},
		{Repo: b, Path: "small.json", State: hfhub.FileFailed, Err: errors.New("boom"), Done: 1, Size: 1 << 20, TotalDone: 4<<20 + 1, Total: 5 << 20, FilesDone: 1, Files: 2},
	}
}

func TestPullDisplay(t *testing.T) {
	t.Run("terminal", func(t *testing.T) {
		var out bytes.Buffer
		d := newPullDisplay(&env{stderr: &out, stderrTTY: true, width: func() int { return 100 }}, false)
		clock := time.Unix(0, 0)
		d.now = func() time.Time { clock = clock.Add(redrawEvery); return clock }
		for _, p := range pullEvents() {
			d.update(p)
		}
		d.finish()
		s := out.String()
		for _, want := range []string{"org/r/big.safetensors", "[###############---------------] 2.0 MiB / 4.0 MiB",
			"total (1/2 files)", "done   org/r/big.safetensors (4.0 MiB)", "failed org/r/small.json: boom", "\033[1A\r\033[K"} {
			if !strings.Contains(s, want) {
				t.Errorf("output lacks %q:\n%q", want, s)
			}
		}
	})
	t.Run("plain", func(t *testing.T) {
		var out bytes.Buffer
		d := newPullDisplay(&env{stderr: &out}, false)
		for _, p := range pullEvents() {
			d.update(p)
		}
		d.finish()
		s := out.String()
		if strings.Contains(s, "\033") || strings.Contains(s, "[#") {
			t.Errorf("terminal codes or bars in plain output:\n%q", s)
		}
		for _, want := range []string{"done   org/r/big.safetensors (4.0 MiB)", "failed org/r/small.json: boom", "total 4.0 MiB / 5.0 MiB, 1/2 files"} {
			if !strings.Contains(s, want) {
				t.Errorf("output lacks %q:\n%s", want, s)
			}
		}
	})
	t.Run("quiet", func(t *testing.T) {
		var out bytes.Buffer
		d := newPullDisplay(&env{stderr: &out, stderrTTY: true}, true)
		for _, p := range pullEvents() {
			d.update(p)
		}
		d.finish()
		if out.Len() != 0 {
			t.Errorf("quiet output %q", out.String())
		}
	})
}

func TestBarLine(t *testing.T) {
	long := "hunyuanvideo-community/HunyuanVideo/text_encoder/model-00001-of-00004.safetensors"
	for _, tc := range []struct {
		label string
		width int
		want  string
	}{
		{"a", 100, "a" + strings.Repeat(" ", 39) + " [###############---------------] 1.0 KiB / 2.0 KiB"},
		{long, 100, "…" + long[len(long)-39:] + " [###############---------------] 1.0 KiB / 2.0 KiB"},
		{"a", 50, "a 1.0 KiB / 2.0 KiB"},
	} {
		if got := barLine(tc.label, 1024, 2048, tc.width); got != tc.want {
			t.Errorf("barLine(%q, %d) =\n%q\nwant\n%q", tc.label, tc.width, got, tc.want)
		}
	}
}
