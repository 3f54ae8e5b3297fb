package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/supervisor/video"
)

// exitPNGFrames is the framepack CLI's exit status for a job that finished with its frames
// saved as PNG files because the server has no ffmpeg (cmd/framepack).
const exitPNGFrames = 8

// outcome reads the CLI's exit: a note for a job that finished with its frames saved as PNG
// files (the server has no ffmpeg), an error for any other failure.
func outcome(genErr error, out string) (note, errMsg string) {
	var exit *exec.ExitError
	switch {
	case errors.As(genErr, &exit) && exit.ExitCode() == exitPNGFrames:
		return "frames saved as PNG: " + lastLines(out, 1), ""
	case genErr != nil:
		return "", fmt.Sprintf("framepack: %v: %s", genErr, lastLines(out, 5))
	}
	return "", ""
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// hashOutputs sets the job's latents hash (the last section file in history) and output hash
// (the final video's frames), the video's path, format and size.
func (res *Budget) hashOutputs(history, videoPath string) error {
	var err error
	if res.LatentsSHA256, err = lastSectionLatents(history); err != nil {
		return err
	}
	if videoPath == "" {
		return errors.New("the CLI printed no video path")
	}
	st, err := os.Stat(videoPath)
	if err != nil {
		return fmt.Errorf("final video: %w", err)
	}
	res.VideoPath, res.VideoBytes = videoPath, treeBytes(videoPath)
	res.VideoFormat = "mp4"
	if st.IsDir() {
		res.VideoFormat = "png"
	}
	res.OutputSHA256, err = framesHash(videoPath, st.IsDir())
	return err
}

// lastSectionLatents hashes the history_latents tensor of the last section file in history
// (a job keeps only its last: history files hold the latents later sections and a resume read,
// no pixels).
func lastSectionLatents(history string) (string, error) {
	files, _ := filepath.Glob(filepath.Join(history, "section-*.safetensors"))
	if len(files) == 0 {
		return "", fmt.Errorf("no section files in %s", history)
	}
	sort.Strings(files)
	name := files[len(files)-1]
	raw, err := os.ReadFile(name)
	if err != nil {
		return "", err
	}
	h, err := safetensors.ParseHeader(raw, int64(len(raw)))
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	t, ok := h.Lookup("history_latents")
	if !ok {
		return "", fmt.Errorf("%s: no tensor history_latents", name)
	}
	sum := sha256.Sum256(raw[h.DataStart+t.Begin : h.DataStart+t.End])
	return hex.EncodeToString(sum[:]), nil
}

// framesHash hashes a video's frames: a PNG folder's files in name order (one encoder writes
// them all, so equal pixels are equal files), an MP4's frames decoded to RGB by ffmpeg (its
// container holds the job's metadata, which differs between jobs).
func framesHash(path string, pngDir bool) (string, error) {
	h := sha256.New()
	if !pngDir {
		rgb, err := (&video.Writer{}).ReadFrames(context.Background(), path)
		if err != nil {
			return "", err
		}
		if len(rgb) == 0 {
			return "", fmt.Errorf("%s: no frames", path)
		}
		h.Write(rgb)
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	names, _ := filepath.Glob(filepath.Join(path, "*.png"))
	if len(names) == 0 {
		return "", fmt.Errorf("%s: no PNG frames", path)
	}
	sort.Strings(names)
	for _, n := range names {
		f, err := os.Open(n)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("%s: %w", n, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// jobSettings is the part of the job's settings (pipeline.Settings, the JSON file beside each
// video) the benchmark reads: how the transformer held its weights.
type jobSettings struct {
	Weights *struct {
		Quantize   string `json:"quantize"`
		Format     string `json:"format"`
		FP8Compute string `json:"fp8_compute"`
	} `json:"weights"`
}

// readWeights sets the weights format and fp8 compute mode the job's settings beside its final
// video report (<video without extension>.json, for an MP4 and a PNG folder alike). A job that
// asked for fp8 weights must have loaded them: an fp8 budget whose transformer ran in 16 bits
// would measure the wrong thing.
func (res *Budget) readWeights(videoPath string) error {
	name := strings.TrimSuffix(videoPath, filepath.Ext(videoPath)) + ".json"
	raw, err := os.ReadFile(name)
	if err != nil {
		return fmt.Errorf("the job's settings: %w", err)
	}
	var s jobSettings
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("the job's settings %s: %w", name, err)
	}
	if s.Weights != nil {
		res.WeightsFormat, res.ServedFP8Compute = s.Weights.Format, s.Weights.FP8Compute
	}
	if res.Weights != "" && res.WeightsFormat == "" {
		return fmt.Errorf("the job asked for --weights %s, but its settings (%s) report no 8-bit weights", res.Weights, name)
	}
	return nil
}
