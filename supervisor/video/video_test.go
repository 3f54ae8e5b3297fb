package video_test

import (
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/supervisor/video"
)

// gradient returns a smooth moving gradient, easy for H.264 and for chroma subsampling.
func gradient(frames, h, w int) video.Clip {
	c := video.Clip{Frames: frames, Height: h, Width: w, RGB: make([]byte, frames*h*w*3)}
	for t := 0; t < frames; t++ {
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				i := ((t*h+y)*w + x) * 3
				c.RGB[i] = byte(x * 255 / w)
				c.RGB[i+1] = byte(y * 255 / h)
				c.RGB[i+2] = byte(t * 255 / frames)
			}
		}
	}
	return c
}

func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not installed (make setup installs it): %v", name, err)
	}
}

type probe struct {
	Codec, PixFmt, Rate string
	Width, Height       int
	Frames              int
}

func ffprobe(t *testing.T, path string) probe {
	t.Helper()
	out, err := exec.Command("ffprobe", "-v", "error", "-select_streams", "v:0", "-count_frames",
		"-show_entries", "stream=codec_name,pix_fmt,width,height,r_frame_rate,avg_frame_rate,nb_read_frames",
		"-of", "json", path).Output()
	if err != nil {
		t.Fatalf("ffprobe %s: %v", path, err)
	}
	var r struct {
		Streams []struct {
			CodecName    string `json:"codec_name"`
			PixFmt       string `json:"pix_fmt"`
			Width        int    `json:"width"`
			Height       int    `json:"height"`
			RFrameRate   string `json:"r_frame_rate"`
			AvgFrameRate string `json:"avg_frame_rate"`
			NbReadFrames string `json:"nb_read_frames"`
		} `json:"streams"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Streams) != 1 {
		t.Fatalf("ffprobe output %s: %v", out, err)
	}
	s := r.Streams[0]
	n, _ := strconv.Atoi(s.NbReadFrames)
	if s.AvgFrameRate != s.RFrameRate {
		t.Errorf("avg_frame_rate %s != r_frame_rate %s", s.AvgFrameRate, s.RFrameRate)
	}
	return probe{Codec: s.CodecName, PixFmt: s.PixFmt, Rate: s.RFrameRate, Width: s.Width, Height: s.Height, Frames: n}
}

func TestWriteMP4(t *testing.T) {
	needTool(t, "ffmpeg")
	needTool(t, "ffprobe")
	for _, tc := range []struct {
		name          string
		frames, h, w  int
		crf           int
		maxMeanAbsErr float64
	}{
		{name: "one section of window 9", frames: 33, h: 48, w: 64, crf: 16, maxMeanAbsErr: 6},
		{name: "single frame lossless", frames: 1, h: 32, w: 32, crf: 0, maxMeanAbsErr: 3},
		{name: "portrait odd frame count", frames: 7, h: 64, w: 32, crf: 51, maxMeanAbsErr: 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "out", "video.mp4")
			clip := gradient(tc.frames, tc.h, tc.w)
			var w video.Writer
			out, err := w.Write(t.Context(), path, clip, tc.crf)
			if err != nil {
				t.Fatal(err)
			}
			if out.Format != video.FormatMP4 || out.Path != path || out.Frames != tc.frames || out.Note != "" {
				t.Fatalf("output %+v", out)
			}
			if _, err := os.Stat(path + video.PartialExt); !os.IsNotExist(err) {
				t.Errorf("partial file left behind: %v", err)
			}
			p := ffprobe(t, path)
			want := probe{Codec: "h264", PixFmt: "yuv420p", Rate: "30/1", Width: tc.w, Height: tc.h, Frames: tc.frames}
			if p != want {
				t.Fatalf("ffprobe: got %+v, want %+v", p, want)
			}
			// Decode back to RGB: the content must be the clip, within what crf and 4:2:0 allow.
			raw, err := exec.Command("ffmpeg", "-v", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1").Output()
			if err != nil {
				t.Fatal(err)
			}
			if len(raw) != len(clip.RGB) {
				t.Fatalf("decoded %d bytes, want %d", len(raw), len(clip.RGB))
			}
			var sum float64
			for i := range raw {
				d := float64(raw[i]) - float64(clip.RGB[i])
				if d < 0 {
					d = -d
				}
				sum += d
			}
			mae := sum / float64(len(raw))
			t.Logf("mean abs error %.2f at crf %d", mae, tc.crf)
			if mae > tc.maxMeanAbsErr {
				t.Errorf("mean abs error %.2f > %.2f", mae, tc.maxMeanAbsErr)
			}
		})
	}
}

func checkPNGs(t *testing.T, dir string, clip video.Clip) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != clip.Frames {
		t.Fatalf("%d files in %s, want %d", len(entries), dir, clip.Frames)
	}
	for i, e := range entries {
		if want := strconv.Itoa(1000000 + i)[1:] + ".png"; e.Name() != want {
			t.Fatalf("file %d is %s, want %s", i, e.Name(), want)
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if b := img.Bounds(); b.Dx() != clip.Width || b.Dy() != clip.Height {
			t.Fatalf("frame %d is %v", i, b)
		}
		for _, xy := range [][2]int{{0, 0}, {clip.Width - 1, clip.Height - 1}, {clip.Width / 2, clip.Height / 3}} {
			r, g, b, _ := img.At(xy[0], xy[1]).RGBA()
			j := ((i*clip.Height+xy[1])*clip.Width + xy[0]) * 3
			if byte(r>>8) != clip.RGB[j] || byte(g>>8) != clip.RGB[j+1] || byte(b>>8) != clip.RGB[j+2] {
				t.Fatalf("frame %d pixel %v: got %d,%d,%d want %v", i, xy, r>>8, g>>8, b>>8, clip.RGB[j:j+3])
			}
		}
	}
}

func TestWriteWithoutFFmpegKeepsPNGs(t *testing.T) {
	// A PATH without ffmpeg, as on a machine where make setup did not run.
	t.Setenv("PATH", t.TempDir())
	dir := t.TempDir()
	path := filepath.Join(dir, "video.mp4")
	clip := gradient(5, 16, 24)
	var w video.Writer
	if _, err := w.Available(); err == nil {
		t.Fatal("ffmpeg found with an empty PATH")
	}
	out, err := w.Write(t.Context(), path, clip, 16)
	if err != nil {
		t.Fatal(err)
	}
	wantDir := filepath.Join(dir, "video"+video.FramesDirExt)
	if out.Format != video.FormatPNG || out.Path != wantDir || out.Frames != 5 || !strings.Contains(out.Note, "ffmpeg") {
		t.Fatalf("output %+v", out)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("mp4 exists without ffmpeg: %v", err)
	}
	checkPNGs(t, wantDir, clip)
	if _, err := os.Stat(wantDir + video.PartialExt); !os.IsNotExist(err) {
		t.Errorf("partial dir left: %v", err)
	}
}

func TestWriteRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	var w video.Writer
	for _, tc := range []struct {
		name string
		clip video.Clip
		crf  int
	}{
		{name: "no frames", clip: video.Clip{Frames: 0, Height: 4, Width: 4}},
		{name: "odd width", clip: video.Clip{Frames: 1, Height: 4, Width: 5, RGB: make([]byte, 60)}},
		{name: "short buffer", clip: video.Clip{Frames: 2, Height: 4, Width: 4, RGB: make([]byte, 48)}},
		{name: "crf too high", clip: gradient(1, 4, 4), crf: 52},
		{name: "crf negative", clip: gradient(1, 4, 4), crf: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".mp4")
			if _, err := w.Write(t.Context(), path, tc.clip, tc.crf); err == nil {
				t.Fatal("no error")
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("output exists after error: %v", err)
			}
		})
	}
	_, err := w.Write(t.Context(), filepath.Join(dir, "x.mp4"), video.Clip{Frames: 1, Height: 3, Width: 4, RGB: make([]byte, 36)}, 16)
	if !errors.Is(err, video.ErrBadClip) {
		t.Errorf("odd height: got %v, want ErrBadClip", err)
	}
}

func TestWriteCancelledLeavesNothing(t *testing.T) {
	needTool(t, "ffmpeg")
	dir := t.TempDir()
	path := filepath.Join(dir, "video.mp4")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var w video.Writer
	if _, err := w.Write(ctx, path, gradient(30, 64, 64), 16); err == nil {
		t.Fatal("no error from a cancelled write")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("files left after a cancelled write: %v", entries)
	}
	// A cancelled PNG write leaves nothing either.
	ctx2, cancel2 := context.WithTimeout(t.Context(), time.Nanosecond)
	defer cancel2()
	<-ctx2.Done()
	if err := video.WritePNGs(ctx2, filepath.Join(dir, "f.frames"), gradient(3, 4, 4)); err == nil {
		t.Fatal("no error from a cancelled png write")
	}
	entries, _ = os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("files left after a cancelled png write: %v", entries)
	}
}

func TestFailingFFmpegReportsStderr(t *testing.T) {
	// An "ffmpeg" that fails the way a broken install does: the error carries its stderr.
	dir := t.TempDir()
	fake := filepath.Join(dir, "ffmpeg")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\ncat >/dev/null\necho 'Unknown encoder libx264' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	w := video.Writer{FFmpeg: fake}
	path := filepath.Join(dir, "v.mp4")
	_, err := w.Write(t.Context(), path, gradient(2, 4, 4), 16)
	if err == nil || !strings.Contains(err.Error(), "Unknown encoder libx264") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("output exists after failure")
	}
}

func TestFromFrames(t *testing.T) {
	// A [1, 3, 2, 2, 4] pixel tensor in [-1, 1] through imageproc's MP4 conversion.
	v := imageproc.Video{B: 1, C: 3, T: 2, H: 2, W: 4, Data: make([]float32, 3*2*2*4)}
	for i := range v.Data {
		v.Data[i] = float32(i%5)/2 - 1 // -1, -0.5, 0, 0.5, 1
	}
	f, err := imageproc.VideoFrames(v)
	if err != nil {
		t.Fatal(err)
	}
	c, err := video.FromFrames(f)
	if err != nil {
		t.Fatal(err)
	}
	if c.Frames != 2 || c.Height != 2 || c.Width != 4 || len(c.RGB) != 48 {
		t.Fatalf("clip %+v", c)
	}
	// Frame 0, pixel (0,0): channels 0, 1, 2 start at 0, 16, 32 → -1, -0.5, 0 → 0, 63, 127.
	if c.RGB[0] != 0 || c.RGB[1] != 63 || c.RGB[2] != 127 {
		t.Fatalf("first pixel %v", c.RGB[:3])
	}
	if _, err := video.FromFrames(imageproc.Frames{T: 1, H: 2, W: 2, C: 4, Pix: make([]byte, 16)}); !errors.Is(err, video.ErrBadClip) {
		t.Fatalf("4 channels: %v", err)
	}
}
