package video

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// A long video is written in linear time: each section's frames are encoded once, as a segment
// of their own (Writer.Write), and a video made of segments is joined from them without
// re-encoding (ffmpeg's concat demuxer copying the H.264 stream; for PNG frames, hard links).
// Which segments make a video, in time order, is its parts file, "<video>.parts.json" beside
// it: the video itself is made from it when it is first read (Materialize), so a job that
// writes many sections writes each frame once, and a "video so far" only when a client asks
// for it.

// PartsExt is appended to a video's path to name its parts file.
const PartsExt = ".parts.json"

// Parts are the segments a video is joined from, in time order.
type Parts struct {
	// Segments are the segment files (MP4s or PNG directories), relative to the parts file's
	// folder, in time order.
	Segments []string `json:"segments,omitempty"`
	// Frames is the number of frames of the segments.
	Frames int `json:"frames"`
	// Pending is a segment outside the job's folder (absolute: a job's frames not final yet,
	// kept in shared memory rather than written to disk), joined before the others when
	// PendingFirst, else after them, and left out when it is gone (the daemon that wrote it
	// stopped). PendingFrames is its number of frames.
	Pending       string `json:"pending,omitempty"`
	PendingFirst  bool   `json:"pending_first,omitempty"`
	PendingFrames int    `json:"pending_frames,omitempty"`
	// Metadata are the MP4 tags of the joined video (ignored for PNG frames).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// files are the segment paths of parts in time order, the pending one where it still is, and
// their frame count.
func (p Parts) files(dir string) ([]string, int) {
	out := make([]string, 0, len(p.Segments)+1)
	for _, s := range p.Segments {
		out = append(out, filepath.Join(dir, s))
	}
	frames := p.Frames
	if p.Pending != "" {
		if _, err := os.Stat(p.Pending); err == nil {
			frames += p.PendingFrames
			if p.PendingFirst {
				out = append([]string{p.Pending}, out...)
			} else {
				out = append(out, p.Pending)
			}
		}
	}
	return out, frames
}

// PartsPath is the parts file of the video at path.
func PartsPath(path string) string { return path + PartsExt }

// WriteParts writes the parts file of the video at path (atomically).
func WriteParts(path string, p Parts) error {
	raw, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return fmt.Errorf("write parts of %s: %w", path, err)
	}
	tmp := PartsPath(path) + PartialExt
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return fmt.Errorf("write parts of %s: %w", path, err)
	}
	if err := os.Rename(tmp, PartsPath(path)); err != nil {
		return fmt.Errorf("write parts of %s: %w", path, err)
	}
	return nil
}

// ReadParts reads the parts file of the video at path.
func ReadParts(path string) (Parts, error) {
	raw, err := os.ReadFile(PartsPath(path))
	if err != nil {
		return Parts{}, err
	}
	var p Parts
	if err := json.Unmarshal(raw, &p); err != nil {
		return Parts{}, fmt.Errorf("parts of %s: %w", path, err)
	}
	for _, s := range p.Segments {
		if s == "" || filepath.IsAbs(s) || strings.Contains(s, "..") {
			return Parts{}, fmt.Errorf("parts of %s: segment %q is not a file beside it", path, s)
		}
	}
	if p.Pending != "" && (!filepath.IsAbs(p.Pending) || strings.Contains(p.Pending, "..")) {
		return Parts{}, fmt.Errorf("parts of %s: pending segment %q is not an absolute path", path, p.Pending)
	}
	return p, nil
}

// Materialize makes the video at path from its parts file when it is not there yet (a video
// so far that no client asked for before), and returns where it is: path, or its PNG
// directory when the segments are PNG frames. A video without a parts file is returned as it
// is, or os.ErrNotExist.
func (w *Writer) Materialize(ctx context.Context, path string) (string, error) {
	for _, p := range []string{path, FramesDir(path)} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	parts, err := ReadParts(path)
	if err != nil {
		return "", err
	}
	out, err := w.Join(ctx, path, parts)
	if err != nil {
		return "", err
	}
	return out.Path, nil
}

// Join writes the video at path from parts' segments without re-encoding: MP4 segments are
// concatenated by ffmpeg's concat demuxer (stream copy, +faststart, parts' metadata), PNG
// directories into path's PNG directory by hard links renumbered in order (copies where links
// fail). Every segment must be of the same kind. Like Write, the output appears atomically.
func (w *Writer) Join(ctx context.Context, path string, parts Parts) (Output, error) {
	segs, frames := parts.files(filepath.Dir(path))
	if len(segs) == 0 {
		return Output{}, fmt.Errorf("join %s: no segments", path)
	}
	png := 0
	for _, s := range segs {
		if strings.HasSuffix(s, FramesDirExt) {
			png++
		}
	}
	switch png {
	case len(segs):
		n, err := joinPNGs(ctx, FramesDir(path), segs)
		if err != nil {
			return Output{}, err
		}
		return Output{Path: FramesDir(path), Format: FormatPNG, Frames: n, Note: "ffmpeg is not installed: frames kept as PNG files"}, nil
	case 0:
	default:
		return Output{}, fmt.Errorf("join %s: %d of %d segments are PNG frames, the rest MP4s", path, png, len(segs))
	}
	ffmpeg, err := w.Available()
	if err != nil {
		return Output{}, fmt.Errorf("join %s: %w", path, err)
	}
	if err := joinMP4s(ctx, ffmpeg, path, segs, parts.Metadata); err != nil {
		return Output{}, err
	}
	return Output{Path: path, Format: FormatMP4, Frames: frames}, nil
}

// joinMP4s runs ffmpeg's concat demuxer over segs into path (through "<path>.partial").
func joinMP4s(ctx context.Context, ffmpeg, path string, segs []string, md map[string]string) (err error) {
	partial := path + PartialExt
	list := path + ".concat" + PartialExt
	defer func() {
		_ = os.Remove(list)
		if err != nil {
			_ = os.Remove(partial)
		}
	}()
	var b strings.Builder
	b.WriteString("ffconcat version 1.0\n")
	for _, s := range segs {
		abs, err := filepath.Abs(s)
		if err != nil {
			return fmt.Errorf("join %s: %w", path, err)
		}
		fmt.Fprintf(&b, "file '%s'\n", strings.ReplaceAll(abs, "'", `'\''`))
	}
	if err := os.WriteFile(list, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("join %s: %w", path, err)
	}
	args := withMetadata([]string{"-hide_banner", "-nostdin", "-loglevel", "error", "-y", "-f", "concat", "-safe", "0", "-i", list,
		"-map", "0:v", "-c", "copy", "-movflags", "+faststart", "-f", "mp4", partial}, md)
	cmd := exec.CommandContext(ctx, ffmpeg, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 8 << 10}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("join %s: %w", path, context.Cause(ctx))
		}
		return fmt.Errorf("join %s: ffmpeg: %w: %s", path, err, lastLines(stderr.String(), 5))
	}
	if err := syncFile(partial); err != nil {
		return fmt.Errorf("join %s: %w", path, err)
	}
	if err := os.Rename(partial, path); err != nil {
		return fmt.Errorf("join %s: %w", path, err)
	}
	return nil
}

// joinPNGs links the frames of the PNG directories segs, in order, into dir (through
// "<dir>.partial") and returns their number.
func joinPNGs(ctx context.Context, dir string, segs []string) (n int, err error) {
	partial := dir + PartialExt
	if err := os.RemoveAll(partial); err != nil {
		return 0, fmt.Errorf("join pngs %s: %w", dir, err)
	}
	if err := os.MkdirAll(partial, 0o755); err != nil {
		return 0, fmt.Errorf("join pngs %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(partial)
		}
	}()
	for _, s := range segs {
		entries, err := os.ReadDir(s)
		if err != nil {
			return 0, fmt.Errorf("join pngs %s: %w", dir, err)
		}
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".png") {
				names = append(names, e.Name())
			}
		}
		slices.Sort(names)
		for _, name := range names {
			if err := ctx.Err(); err != nil {
				return 0, fmt.Errorf("join pngs %s: %w", dir, context.Cause(ctx))
			}
			dst := filepath.Join(partial, fmt.Sprintf("%06d.png", n))
			if err := linkOrCopy(filepath.Join(s, name), dst); err != nil {
				return 0, fmt.Errorf("join pngs %s: %w", dir, err)
			}
			n++
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return 0, fmt.Errorf("join pngs %s: %w", dir, err)
	}
	if err := os.Rename(partial, dir); err != nil {
		return 0, fmt.Errorf("join pngs %s: %w", dir, err)
	}
	return n, nil
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	raw, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return errors.Join(os.WriteFile(dst, raw, 0o644))
}

// ReadFrames returns every frame of the video at path as RGB24 bytes in order: an MP4 decoded
// by ffmpeg, or the PNGs of a frames directory. Two videos written from the same pixels read
// the same.
func (w *Writer) ReadFrames(ctx context.Context, path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read frames: %w", err)
	}
	if st.IsDir() {
		return readPNGFrames(path)
	}
	ffmpeg, err := w.Available()
	if err != nil {
		return nil, fmt.Errorf("read frames of %s: %w", path, err)
	}
	cmd := exec.CommandContext(ctx, ffmpeg, "-hide_banner", "-nostdin", "-loglevel", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1")
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 8 << 10}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("read frames of %s: ffmpeg: %w: %s", path, err, lastLines(stderr.String(), 5))
	}
	return out, nil
}

func readPNGFrames(dir string) ([]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read frames: %w", err)
	}
	var out []byte
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".png") {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read frames: %w", err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read frames %s: %w", e.Name(), err)
		}
		b := img.Bounds()
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				r, g, bl, _ := img.At(x, y).RGBA()
				out = append(out, byte(r>>8), byte(g>>8), byte(bl>>8))
			}
		}
	}
	return out, nil
}
