package video_test

import (
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/framepackd/framepackd/supervisor/video"
)

// probeTags reads an MP4's container tags with ffprobe.
func probeTags(t *testing.T, path string) map[string]string {
	t.Helper()
	out, err := exec.Command("ffprobe", "-v", "error", "-show_entries", "format_tags", "-of", "json", path).Output()
	if err != nil {
		t.Fatalf("ffprobe %s: %v", path, err)
	}
	var r struct {
		Format struct {
			Tags map[string]string `json:"tags"`
		} `json:"format"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("ffprobe output %s: %v", out, err)
	}
	return r.Format.Tags
}

// TestWriteMetadata writes an MP4 with metadata tags (a JSON comment, as the pipeline writes
// a job's settings) and reads them back with ffprobe; a key ffmpeg cannot take is refused.
func TestWriteMetadata(t *testing.T) {
	needTool(t, "ffmpeg")
	needTool(t, "ffprobe")
	path := filepath.Join(t.TempDir(), "v.mp4")
	clip := gradient(3, 16, 16)
	settings := `{"prompt":"[0s: a cat] [1s: it jumps]","seed":31337,"loras":[{"path":"/l/a.safetensors","strength":0.8}]}`
	clip.Metadata = map[string]string{"comment": settings, "title": "job abc"}
	var w video.Writer
	if _, err := w.Write(t.Context(), path, clip, 16); err != nil {
		t.Fatal(err)
	}
	tags := probeTags(t, path)
	if tags["comment"] != settings || tags["title"] != "job abc" {
		t.Fatalf("tags %v", tags)
	}
	clip.Metadata = map[string]string{"a=b": "x"}
	if _, err := w.Write(t.Context(), path, clip, 16); !errors.Is(err, video.ErrBadClip) {
		t.Fatalf("metadata key with '=': %v, want ErrBadClip", err)
	}
}
