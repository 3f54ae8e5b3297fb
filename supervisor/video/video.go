// Package video writes the job's video files: an H.264 MP4 made by piping raw RGB frames into
// an ffmpeg child process, as FramePack's save_bcthw_as_mp4 writes through torchvision's
// write_video (libx264, yuv420p, the crf of the request, 30 fps) but made to play everywhere
// (High profile, BT.709 tags, +faststart; see Args), or, when ffmpeg is not
// installed, a directory of PNG frames so the job still has its output.
//
// Every output appears atomically: the MP4 is written to "<path>.partial" and renamed when ffmpeg
// exits cleanly; the PNG directory is written as "<dir>.partial" and renamed when complete. A
// cancelled or failed write removes its partial output, so a job directory never holds a
// truncated video under a final name.
package video

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/framepackd/framepackd/internal/imageproc"
)

// FPS is the frame rate of every video FramePack writes (demo_gradio.py: fps=30).
const FPS = 30

// PartialExt is appended to an output's name while it is being written.
const PartialExt = ".partial"

// FramesDirExt is the extension of the PNG directory written instead of an MP4 when ffmpeg is
// missing: "video.mp4" becomes "video.frames/000000.png, 000001.png, …".
const FramesDirExt = ".frames"

// ErrBadClip is returned for a clip whose shape or size is unusable.
var ErrBadClip = errors.New("video: bad clip")

// Clip is a uint8 RGB video in [T, H, W, 3] layout (rows without padding), the frame tensor of
// save_bcthw_as_mp4 after its clamp, ×127.5+127.5 and rearrangement.
type Clip struct {
	// Frames is the number of frames (T).
	Frames int
	// Height and Width are the frame size in pixels; H.264 with yuv420p needs both even.
	Height, Width int
	// RGB holds Frames×Height×Width×3 bytes.
	RGB []byte
	// Metadata are tags written into the MP4 (ffmpeg -metadata key=value, e.g. "comment");
	// keys must be non-empty and free of "=". Ignored for PNG frames.
	Metadata map[string]string
}

func (c Clip) frameBytes() int { return c.Height * c.Width * 3 }

// Check reports whether the clip can be written.
func (c Clip) Check() error {
	if c.Frames <= 0 || c.Height <= 0 || c.Width <= 0 {
		return fmt.Errorf("%w: %d frames of %dx%d", ErrBadClip, c.Frames, c.Width, c.Height)
	}
	for k := range c.Metadata {
		if k == "" || strings.Contains(k, "=") {
			return fmt.Errorf("%w: metadata key %q", ErrBadClip, k)
		}
	}
	if c.Height%2 != 0 || c.Width%2 != 0 {
		return fmt.Errorf("%w: %dx%d is odd; yuv420p needs even width and height", ErrBadClip, c.Width, c.Height)
	}
	if len(c.RGB) != c.Frames*c.frameBytes() {
		return fmt.Errorf("%w: %d bytes for %d frames of %dx%d RGB", ErrBadClip, len(c.RGB), c.Frames, c.Width, c.Height)
	}
	return nil
}

// Format is the kind of file an Output is.
type Format int

const (
	// FormatMP4 is an H.264 MP4 file.
	FormatMP4 Format = iota + 1
	// FormatPNG is a directory of PNG frames, written because ffmpeg was missing.
	FormatPNG
)

// String returns "mp4" or "png".
func (f Format) String() string {
	switch f {
	case FormatMP4:
		return "mp4"
	case FormatPNG:
		return "png"
	}
	return "unknown"
}

// Output is what Write produced.
type Output struct {
	// Path is the MP4 file, or the PNG directory when Format is FormatPNG.
	Path string
	// Format says which.
	Format Format
	// Frames is the number of frames written.
	Frames int
	// Note says why the output is not an MP4; empty for an MP4.
	Note string
}

// Writer writes videos. The zero value looks ffmpeg up in PATH on every Write.
type Writer struct {
	// FFmpeg is the ffmpeg executable; empty means "ffmpeg" found through PATH.
	FFmpeg string
	// LookPath finds an executable; nil means exec.LookPath. Tests swap it.
	LookPath func(file string) (string, error)
}

// Available returns ffmpeg's path, or an error saying why there is none.
func (w *Writer) Available() (string, error) {
	name := w.FFmpeg
	if name == "" {
		name = "ffmpeg"
	}
	look := w.LookPath
	if look == nil {
		look = exec.LookPath
	}
	p, err := look(name)
	if err != nil {
		return "", fmt.Errorf("find ffmpeg: %w", err)
	}
	return p, nil
}

// Write writes clip to path as an H.264 MP4 at 30 fps with the given crf (0–51; 0 encodes as
// MinCRF, see Args). When ffmpeg
// is not installed it writes the frames as PNGs into path with its extension replaced by
// ".frames" instead and says so in Output.Note; every other failure is an error and leaves no
// output behind.
func (w *Writer) Write(ctx context.Context, path string, clip Clip, crf int) (Output, error) {
	if err := clip.Check(); err != nil {
		return Output{}, fmt.Errorf("write video %s: %w", path, err)
	}
	if crf < 0 || crf > 51 {
		return Output{}, fmt.Errorf("write video %s: crf %d outside 0..51", path, crf)
	}
	ffmpeg, err := w.Available()
	if err != nil {
		dir := FramesDir(path)
		if err := WritePNGs(ctx, dir, clip); err != nil {
			return Output{}, err
		}
		return Output{Path: dir, Format: FormatPNG, Frames: clip.Frames,
			Note: "ffmpeg is not installed: frames kept as PNG files"}, nil
	}
	if err := writeMP4(ctx, ffmpeg, path, clip, crf); err != nil {
		return Output{}, err
	}
	return Output{Path: path, Format: FormatMP4, Frames: clip.Frames}, nil
}

// FramesDir is the PNG directory that stands in for the MP4 at path.
func FramesDir(path string) string {
	return strings.TrimSuffix(path, filepath.Ext(path)) + FramesDirExt
}

// MinCRF is the lowest crf Write encodes with: crf 0 is lossless H.264, which x264 writes in
// the High 4:4:4 Predictive profile that browsers and phones do not play, so 0 means 1.
const MinCRF = 1

// Args returns ffmpeg's arguments for writing a clip of width×height RGB frames read from
// stdin to out, a video that plays everywhere: libx264 in the High profile with only crf set
// (x264's default preset), yuv420p, rate 30, no audio; the RGB→YUV conversion is BT.709 in TV
// (limited) range and the stream is tagged so (primaries, transfer, matrix, range), so players
// do not guess; the index (moov) is written before the data (+faststart) so a browser can
// start playing while it downloads. crf below MinCRF is raised to it.
func Args(width, height, crf int, out string) []string {
	crf = max(crf, MinCRF)
	return []string{
		"-hide_banner", "-nostdin", "-loglevel", "error", "-y",
		"-f", "rawvideo", "-pix_fmt", "rgb24", "-s", fmt.Sprintf("%dx%d", width, height),
		"-framerate", strconv.Itoa(FPS), "-i", "pipe:0",
		"-an", "-vf", "scale=out_color_matrix=bt709:out_range=tv:flags=bilinear,format=yuv420p",
		"-c:v", "libx264", "-crf", strconv.Itoa(crf), "-profile:v", "high", "-pix_fmt", "yuv420p",
		"-color_primaries", "bt709", "-color_trc", "bt709", "-colorspace", "bt709", "-color_range", "tv",
		"-movflags", "+faststart", "-f", "mp4", out,
	}
}

// withMetadata inserts -metadata key=value pairs (sorted by key) before the output options at
// the end of args ("-f", "mp4", out).
func withMetadata(args []string, md map[string]string) []string {
	if len(md) == 0 || len(args) < 3 {
		return args
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	tail := args[len(args)-3:]
	out := append([]string(nil), args[:len(args)-3]...)
	for _, k := range keys {
		out = append(out, "-metadata", k+"="+md[k])
	}
	return append(out, tail...)
}

func writeMP4(ctx context.Context, ffmpeg, path string, clip Clip, crf int) (err error) {
	partial := path + PartialExt
	defer func() {
		if err != nil {
			_ = os.Remove(partial)
		}
	}()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write mp4 %s: %w", path, err)
	}
	cmd := exec.CommandContext(ctx, ffmpeg, withMetadata(Args(clip.Width, clip.Height, crf, partial), clip.Metadata)...)
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 8 << 10}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("write mp4 %s: %w", path, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("write mp4 %s: start ffmpeg: %w", path, err)
	}
	fb := clip.frameBytes()
	var writeErr error
	for t := 0; t < clip.Frames && writeErr == nil; t++ {
		_, writeErr = stdin.Write(clip.RGB[t*fb : (t+1)*fb])
	}
	closeErr := stdin.Close()
	waitErr := cmd.Wait()
	if ctx.Err() != nil {
		return fmt.Errorf("write mp4 %s: %w", path, context.Cause(ctx))
	}
	if waitErr != nil {
		return fmt.Errorf("write mp4 %s: ffmpeg: %w: %s", path, waitErr, lastLines(stderr.String(), 5))
	}
	if writeErr != nil {
		return fmt.Errorf("write mp4 %s: feed ffmpeg: %w", path, writeErr)
	}
	if closeErr != nil {
		return fmt.Errorf("write mp4 %s: feed ffmpeg: %w", path, closeErr)
	}
	if err := syncFile(partial); err != nil {
		return fmt.Errorf("write mp4 %s: %w", path, err)
	}
	if err := os.Rename(partial, path); err != nil {
		return fmt.Errorf("write mp4 %s: %w", path, err)
	}
	return nil
}

// WritePNGs writes every frame of clip as dir/NNNNNN.png (6 digits, from 000000), through
// "<dir>.partial" renamed when complete; an existing dir is replaced.
func WritePNGs(ctx context.Context, dir string, clip Clip) (err error) {
	if err := clip.Check(); err != nil {
		return fmt.Errorf("write pngs %s: %w", dir, err)
	}
	partial := dir + PartialExt
	if err := os.RemoveAll(partial); err != nil {
		return fmt.Errorf("write pngs %s: %w", dir, err)
	}
	if err := os.MkdirAll(partial, 0o755); err != nil {
		return fmt.Errorf("write pngs %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(partial)
		}
	}()
	// Frames are encoded in parallel, one goroutine a core (PNG's deflate is the cost: at
	// 544×704 about 35 ms a frame on one core).
	fb := clip.frameBytes()
	next := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range max(min(goruntime.NumCPU(), clip.Frames), 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img := image.NewNRGBA(image.Rect(0, 0, clip.Width, clip.Height))
			enc := png.Encoder{CompressionLevel: png.BestSpeed}
			for t := range next {
				src := clip.RGB[t*fb : (t+1)*fb]
				for i, j := 0, 0; i < len(src); i, j = i+3, j+4 {
					img.Pix[j], img.Pix[j+1], img.Pix[j+2], img.Pix[j+3] = src[i], src[i+1], src[i+2], 0xff
				}
				if err := writePNG(filepath.Join(partial, fmt.Sprintf("%06d.png", t)), img, &enc); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	var werr error
feed:
	for t := 0; t < clip.Frames; t++ {
		select {
		case next <- t:
		case werr = <-errs:
			break feed
		case <-ctx.Done():
			werr = context.Cause(ctx)
			break feed
		}
	}
	close(next)
	wg.Wait()
	if werr == nil {
		select {
		case werr = <-errs:
		default:
		}
	}
	if werr != nil {
		return fmt.Errorf("write pngs %s: %w", dir, werr)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("write pngs %s: %w", dir, err)
	}
	if err := os.Rename(partial, dir); err != nil {
		return fmt.Errorf("write pngs %s: %w", dir, err)
	}
	return nil
}

func writePNG(name string, img image.Image, enc *png.Encoder) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := enc.Encode(f, img); err != nil {
		_ = f.Close()
		return fmt.Errorf("encode %s: %w", name, err)
	}
	return f.Close()
}

func syncFile(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// limitedBuffer keeps the first max bytes written to it and discards the rest, so a chatty
// child cannot grow the supervisor's memory.
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); room > 0 {
		if len(p) > room {
			l.buf.Write(p[:room])
		} else {
			l.buf.Write(p)
		}
	}
	return len(p), nil
}

var _ io.Writer = (*limitedBuffer)(nil)

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// FromFrames wraps imageproc's MP4 frame tensor (imageproc.VideoFrames: save_bcthw_as_mp4's
// clamp, ×127.5+127.5, truncation and '(m n) c t h w -> t (m h) (n w) c') as a Clip, without
// copying. It must have three channels.
func FromFrames(f imageproc.Frames) (Clip, error) {
	if f.C != 3 {
		return Clip{}, fmt.Errorf("%w: %d channels, want 3 (RGB)", ErrBadClip, f.C)
	}
	c := Clip{Frames: f.T, Height: f.H, Width: f.W, RGB: f.Pix}
	if err := c.Check(); err != nil {
		return Clip{}, err
	}
	return c, nil
}
