package video_test

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/video"
)

// topLevelBoxes returns the types of an MP4's top-level boxes in file order.
func topLevelBoxes(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var types []string
	var off int64
	for {
		var h [16]byte
		if _, err := f.ReadAt(h[:8], off); err == io.EOF {
			return types
		} else if err != nil {
			t.Fatal(err)
		}
		size := int64(binary.BigEndian.Uint32(h[:4]))
		if size == 1 { // 64-bit size follows the type
			if _, err := f.ReadAt(h[8:16], off+8); err != nil {
				t.Fatal(err)
			}
			size = int64(binary.BigEndian.Uint64(h[8:16]))
		}
		if size < 8 {
			t.Fatalf("box %q at %d: size %d", h[4:8], off, size)
		}
		types = append(types, string(h[4:8]))
		off += size
	}
}

// TestMP4PlaysEverywhere checks what browsers and phones need of every MP4 the service writes,
// at the default crf and at crf 0: H.264 High profile (never High 4:4:4, which crf 0 used to
// give), yuv420p, BT.709 colour tags in TV range, and the index (moov) before the data (mdat).
func TestMP4PlaysEverywhere(t *testing.T) {
	needTool(t, "ffmpeg")
	needTool(t, "ffprobe")
	for _, crf := range []int{api.DefaultMP4CRF, 0} {
		path := filepath.Join(t.TempDir(), "v.mp4")
		var w video.Writer
		if _, err := w.Write(t.Context(), path, gradient(9, 48, 64), crf); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
			"stream=profile,pix_fmt,color_range,color_space,color_transfer,color_primaries", "-of", "json", path).Output()
		if err != nil {
			t.Fatalf("ffprobe: %v", err)
		}
		var r struct {
			Streams []map[string]string `json:"streams"`
		}
		if err := json.Unmarshal(out, &r); err != nil || len(r.Streams) != 1 {
			t.Fatalf("ffprobe output %s: %v", out, err)
		}
		want := map[string]string{"profile": "High", "pix_fmt": "yuv420p", "color_range": "tv",
			"color_space": "bt709", "color_transfer": "bt709", "color_primaries": "bt709"}
		for k, v := range want {
			if got := r.Streams[0][k]; got != v {
				t.Errorf("crf %d: %s is %q, want %q", crf, k, got, v)
			}
		}
		moov, mdat := -1, -1
		for i, b := range topLevelBoxes(t, path) {
			switch b {
			case "moov":
				moov = i
			case "mdat":
				mdat = i
			}
		}
		if moov < 0 || mdat < 0 || moov > mdat {
			t.Errorf("crf %d: moov at box %d, mdat at box %d: want moov first (+faststart)", crf, moov, mdat)
		}
	}
}
