package video

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrBadVideo marks an input video ffmpeg cannot read, or one outside the limits.
var ErrBadVideo = errors.New("bad video")

// Info is what ffprobe says of a video's first video stream.
type Info struct {
	// Container is the format's name ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", …).
	Container string
	// Codec is the stream's codec ("h264", "vp9", …).
	Codec string
	// Width and Height are the frame size in pixels.
	Width, Height int
	// Frames is the number of frames: the stream's stated count, else its packets counted.
	Frames int
	// FPS is the average frame rate.
	FPS float64
	// Duration is the stream's (or the container's) duration; 0 when unknown.
	Duration time.Duration
}

// Limits bound the input videos a job may extend.
type Limits struct {
	// MaxFrames, MaxSeconds and MaxPixels (width × height of a frame) bound the video; 0 means
	// no bound.
	MaxFrames  int
	MaxSeconds float64
	MaxPixels  int
}

// Check says what is wrong with a video of this Info under the limits, nil when nothing.
func (l Limits) Check(in Info) error {
	switch {
	case in.Width <= 0 || in.Height <= 0:
		return fmt.Errorf("%w: its video stream has no frame size", ErrBadVideo)
	case in.Frames <= 0:
		return fmt.Errorf("%w: its video stream has no frames", ErrBadVideo)
	case l.MaxPixels > 0 && in.Width*in.Height > l.MaxPixels:
		return fmt.Errorf("%w: frames of %dx%d (%d pixels), the limit is %d pixels (--max-video-pixels)", ErrBadVideo, in.Width, in.Height, in.Width*in.Height, l.MaxPixels)
	case l.MaxFrames > 0 && in.Frames > l.MaxFrames:
		return fmt.Errorf("%w: %d frames, the limit is %d (--max-video-frames): cut the video shorter", ErrBadVideo, in.Frames, l.MaxFrames)
	case l.MaxSeconds > 0 && in.Duration.Seconds() > l.MaxSeconds:
		return fmt.Errorf("%w: %.1f s long, the limit is %g s (--max-video-seconds): cut the video shorter", ErrBadVideo, in.Duration.Seconds(), l.MaxSeconds)
	}
	return nil
}

// FFprobe returns ffprobe's path: beside the configured ffmpeg when that is a path, else found
// through PATH.
func (w *Writer) FFprobe() (string, error) {
	name := "ffprobe"
	if w.FFmpeg != "" && strings.ContainsRune(w.FFmpeg, filepath.Separator) {
		name = filepath.Join(filepath.Dir(w.FFmpeg), "ffprobe")
	}
	look := w.LookPath
	if look == nil {
		look = exec.LookPath
	}
	p, err := look(name)
	if err != nil {
		return "", fmt.Errorf("find ffprobe: %w", err)
	}
	return p, nil
}

// Probe reads a video's Info with ffprobe; a file ffprobe cannot read, or without a video
// stream, is ErrBadVideo with ffprobe's words.
func (w *Writer) Probe(ctx context.Context, path string) (Info, error) {
	ffprobe, err := w.FFprobe()
	if err != nil {
		return Info{}, err
	}
	out, err := run(ctx, ffprobe, "-v", "error", "-select_streams", "v:0", "-count_packets",
		"-show_entries", "format=format_name,duration:stream=codec_name,width,height,nb_frames,nb_read_packets,avg_frame_rate,duration",
		"-of", "json", path)
	if err != nil {
		return Info{}, fmt.Errorf("%w: ffprobe cannot read it: %v", ErrBadVideo, err)
	}
	var raw struct {
		Format struct {
			Name     string `json:"format_name"`
			Duration string `json:"duration"`
		} `json:"format"`
		Streams []struct {
			Codec    string `json:"codec_name"`
			Width    int    `json:"width"`
			Height   int    `json:"height"`
			Frames   string `json:"nb_frames"`
			Packets  string `json:"nb_read_packets"`
			Rate     string `json:"avg_frame_rate"`
			Duration string `json:"duration"`
		} `json:"streams"`
	}
	if err := json.Unmarshal(out, &raw); err != nil {
		return Info{}, fmt.Errorf("%w: ffprobe's answer: %v", ErrBadVideo, err)
	}
	if len(raw.Streams) == 0 {
		return Info{}, fmt.Errorf("%w: no video stream (container %s)", ErrBadVideo, raw.Format.Name)
	}
	s := raw.Streams[0]
	in := Info{Container: raw.Format.Name, Codec: s.Codec, Width: s.Width, Height: s.Height}
	if n, err := strconv.Atoi(s.Frames); err == nil && n > 0 {
		in.Frames = n
	} else if n, err := strconv.Atoi(s.Packets); err == nil {
		in.Frames = n
	}
	if num, den, ok := strings.Cut(s.Rate, "/"); ok {
		a, e1 := strconv.ParseFloat(num, 64)
		b, e2 := strconv.ParseFloat(den, 64)
		if e1 == nil && e2 == nil && b > 0 {
			in.FPS = a / b
		}
	}
	for _, d := range []string{s.Duration, raw.Format.Duration} {
		if f, err := strconv.ParseFloat(d, 64); err == nil && f > 0 {
			in.Duration = time.Duration(f * float64(time.Second))
			break
		}
	}
	return in, nil
}

// Decode decodes every frame of a video's first video stream as RGB at the stream's size (or
// at fps frames a second when fps > 0, frames dropped or repeated by ffmpeg's fps filter) and
// hands each to fn in order; the frame's bytes are valid only during the call. It returns the
// number of frames decoded.
func (w *Writer) Decode(ctx context.Context, path string, width, height, fps int, fn func(i int, rgb []byte) error) (int, error) {
	ffmpeg, err := w.Available()
	if err != nil {
		return 0, err
	}
	// -noautorotate: the frames as stored, at the size ffprobe reports (a rotation tag is not
	// applied).
	args := []string{"-v", "error", "-nostdin", "-noautorotate", "-i", path, "-map", "0:v:0", "-an", "-sn"}
	if fps > 0 {
		args = append(args, "-vf", fmt.Sprintf("fps=%d", fps))
	}
	// The stream's own size: a decoder that changes size mid-stream fails the job below.
	args = append(args, "-s", fmt.Sprintf("%dx%d", width, height), "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, ffmpeg, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 8 << 10}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, fmt.Errorf("decode %s: %w", path, err)
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("decode %s: start ffmpeg: %w", path, err)
	}
	frame := make([]byte, width*height*3)
	r := bufio.NewReaderSize(stdout, 1<<20)
	n := 0
	var fnErr error
	for {
		if _, err := io.ReadFull(r, frame); err != nil {
			if !errors.Is(err, io.EOF) {
				fnErr = fmt.Errorf("%w: frame %d is cut short: %v", ErrBadVideo, n, err)
			}
			break
		}
		if fnErr = fn(n, frame); fnErr != nil {
			cancel()
			break
		}
		n++
	}
	_, _ = io.Copy(io.Discard, r)
	waitErr := cmd.Wait()
	switch {
	case fnErr != nil:
		return n, fnErr
	case ctx.Err() != nil:
		return n, fmt.Errorf("decode %s: %w", path, context.Cause(ctx))
	case waitErr != nil:
		return n, fmt.Errorf("%w: ffmpeg cannot decode it: %v: %s", ErrBadVideo, waitErr, lastLines(stderr.String(), 3))
	case n == 0:
		return 0, fmt.Errorf("%w: ffmpeg decoded no frame", ErrBadVideo)
	}
	return n, nil
}

// run runs a command and returns its standard output; an error carries the last lines of its
// standard error.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 8 << 10}
	out, err := cmd.Output()
	if err != nil {
		if msg := lastLines(stderr.String(), 3); msg != "" {
			return nil, fmt.Errorf("%w: %s", err, msg)
		}
		return nil, err
	}
	return out, nil
}
