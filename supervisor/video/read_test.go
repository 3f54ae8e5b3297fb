package video_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/supervisor/video"
)

// losslessVideo writes frames ([T, H, W, 3] RGB) as a PNG-coded MOV (lossless RGB), at fps.
func losslessVideo(t *testing.T, frames [][]byte, w, h, fps int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.mov")
	cmd := exec.Command("ffmpeg", "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", strings.Join([]string{itoa(w), itoa(h)}, "x"),
		"-r", itoa(fps), "-i", "pipe:0", "-c:v", "png", path)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("no ffmpeg: %v", err)
	}
	for _, f := range frames {
		in.Write(f)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	return path
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestProbeAndDecode probes and decodes a lossless video: the frame size, count and rate, and
// every frame's bytes exactly; a 30 fps decode of a 15 fps video repeats each frame; the limits
// and an unreadable file say what is wrong.
func TestProbeAndDecode(t *testing.T) {
	if _, err := exec.LookPath("ffprobe"); err != nil {
		t.Skip("no ffprobe (make setup installs ffmpeg)")
	}
	const w, h, n = 6, 4, 5
	var frames [][]byte
	for i := range n {
		f := make([]byte, w*h*3)
		for j := range f {
			f[j] = byte(i*40 + j)
		}
		frames = append(frames, f)
	}
	path := losslessVideo(t, frames, w, h, 15)
	var vw video.Writer
	ctx := context.Background()
	in, err := vw.Probe(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if in.Width != w || in.Height != h || in.Frames != n || in.FPS != 15 || in.Codec != "png" {
		t.Fatalf("probe %+v", in)
	}
	got := 0
	if _, err := vw.Decode(ctx, path, w, h, 0, func(i int, rgb []byte) error {
		if string(rgb) != string(frames[i]) {
			t.Errorf("frame %d differs", i)
		}
		got++
		return nil
	}); err != nil || got != n {
		t.Fatalf("decoded %d frames: %v", got, err)
	}
	doubled, err := vw.Decode(ctx, path, w, h, 30, func(i int, rgb []byte) error {
		if string(rgb) != string(frames[i/2]) {
			t.Errorf("30 fps frame %d is not frame %d", i, i/2)
		}
		return nil
	})
	if err != nil || doubled != 2*n {
		t.Errorf("30 fps: %d frames, %v", doubled, err)
	}
	for _, tc := range []struct {
		l    video.Limits
		want string
	}{
		{video.Limits{MaxFrames: 4}, "5 frames, the limit is 4"},
		{video.Limits{MaxPixels: 20}, "6x4 (24 pixels)"},
		{video.Limits{MaxSeconds: 0.2}, "the limit is 0.2 s"},
	} {
		if err := tc.l.Check(in); !errors.Is(err, video.ErrBadVideo) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("limits %+v: %v, want %q", tc.l, err, tc.want)
		}
	}
	junk := filepath.Join(t.TempDir(), "junk.mp4")
	os.WriteFile(junk, []byte("not a video at all"), 0o644)
	if _, err := vw.Probe(ctx, junk); !errors.Is(err, video.ErrBadVideo) {
		t.Errorf("junk: %v", err)
	}
}
