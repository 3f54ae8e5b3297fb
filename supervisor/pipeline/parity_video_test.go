package pipeline_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/internal/parity"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// opVideo is the op of the pipeline_video reference fixture's cases.
const opVideo = "pipeline.video_extend"

// losslessVideo writes frames (uint8 [T, H, W, 3] as int64s) as a PNG-coded MOV at fps: ffmpeg
// decodes it to exactly these RGB bytes.
func losslessVideo(t *testing.T, frames []int64, n, h, w, fps int) []byte {
	t.Helper()
	dir := t.TempDir()
	raw := make([]byte, len(frames))
	for i, v := range frames {
		raw[i] = byte(v)
	}
	in := filepath.Join(dir, "frames.rgb")
	if err := os.WriteFile(in, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "in.mov")
	cmd := exec.Command("ffmpeg", "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", fmt.Sprintf("%dx%d", w, h),
		"-r", strconv.Itoa(fps), "-i", in, "-frames:v", strconv.Itoa(n), "-c:v", "png", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("ffmpeg cannot write a PNG-coded MOV here: %v %s", err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// videoCase is a pipeline_video case as a job.
type videoCase struct {
	i2vCase
	f1     bool
	frames []int64 // the input video, uint8 [T, H, W, 3]
	total  int
}

func loadVideoCase(t *testing.T, c parity.Case) videoCase {
	t.Helper()
	var (
		hw                    [2]int
		seed                  int64
		seconds, cfg, gs, rs  float64
		window, steps, res    int
		buckets               [][2]int
		sections              []int
		n, fps, contextFrames int
		variant, modelType    string
	)
	for name, v := range map[string]any{"video_hw": &hw, "seed": &seed, "seconds": &seconds, "latent_window_size": &window,
		"steps": &steps, "cfg": &cfg, "gs": &gs, "rs": &rs, "resolution": &res, "buckets": &buckets, "sections": &sections,
		"video_frames": &n, "video_fps": &fps, "video_context_frames": &contextFrames, "variant": &variant, "studio_model_type": &modelType} {
		if !c.Param(t, name, v) {
			t.Fatalf("case %s: no param %q", c.Name, name)
		}
	}
	var prompt string
	c.InputValue(t, "prompt", &prompt)
	in := c.Input(t, "video_thwc_u8")
	if !parity.SameShape(in.Shape, []int64{int64(n), int64(hw[0]), int64(hw[1]), 3}) {
		t.Fatalf("case %s: video %v, params say %d frames of %v", c.Name, in.Shape, n, hw)
	}
	spec := &framepackv1.JobSpec{Prompt: prompt, Seed: proto.Int64(seed), TotalSecondLength: float32(seconds), LatentWindowSize: uint32(window),
		Steps: uint32(steps), Cfg: float32(cfg), Gs: float32(gs), Rs: float32(rs), Resolution: uint32(res), Cache: "none",
		Variant: variant, InputVideo: losslessVideo(t, in.Ints, n, hw[0], hw[1], fps), VideoContextFrames: proto.Uint32(uint32(contextFrames))}
	for _, b := range buckets {
		spec.Buckets = append(spec.Buckets, &framepackv1.Bucket{Height: uint32(b[0]), Width: uint32(b[1])})
	}
	return videoCase{i2vCase: i2vCase{c: c, spec: spec, window: window, sections: sections, models: caseModels(t, c)}, f1: variant == "f1", frames: in.Ints, total: len(sections)}
}

// TestParityPipelineVideo runs every case of the pipeline_video reference fixture (FramePack-
// Studio's "Video" and "Video F1" extensions of a short input video) through a daemon with real
// workers, the video submitted as a lossless MOV that ffmpeg decodes: the input video's latents,
// the first section's clean latents' source, each section's generated latents, the history,
// the generated pixels and frames within the case's tolerance, and the output video's frames
// (the input's, then the generated ones).
func TestParityPipelineVideo(t *testing.T) {
	fx := loadReferenceOrSkip(t, "pipeline_video", featuresScript)
	workers := buildWorkers(t)
	ran := 0
	for _, c := range fx.Cases {
		if c.Op != opVideo {
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
			continue
		}
		ran++
		t.Run(c.Name, func(t *testing.T) {
			vc := loadVideoCase(t, c)
			opts, job, evs := runParityJob(t, workers, vc.i2vCase)
			total := int(job.GetProgress().GetTotalSections())
			if total != vc.total {
				t.Fatalf("%d sections, the reference ran %d", total, vc.total)
			}
			if s := job.GetSpec(); len(s.GetInputVideo()) != 0 || len(s.GetInputVideoSha256()) != 64 {
				t.Errorf("stored spec keeps %d video bytes, hash %q", len(s.GetInputVideo()), s.GetInputVideoSha256())
			}
			checkEvents(t, vc.i2vCase, evs, total)
			checkOutputsVideo(t, vc, opts.State, job, total)
		})
	}
	if ran == 0 {
		t.Fatalf("fixture %s has no %s case", fx.Name, opVideo)
	}
}

// checkOutputsVideo compares a video job's files with a pipeline_video case.
func checkOutputsVideo(t *testing.T, vc videoCase, state string, job *framepackv1.Job, total int) {
	t.Helper()
	c := vc.c
	jf := openJobFiles(t, state, job.GetId(), total)
	for name, tensor := range map[string]string{"llama_vec": "llama_vec", "clip_pooler": "clip_pooler", "image_hidden": "image_embeddings"} {
		v, shape := read(t, jf.cond, tensor)
		logIntermediate(t, c, name, v, shape)
	}
	for name, want := range map[string]string{"image_np": "image_np"} {
		got, shape := read(t, jf.cond, name)
		ref := c.Intermediate(t, want)
		if d, n := parity.MaxAbsDiff(got, ref.F32); !parity.SameShape(shape, ref.Shape) || d > 1 {
			t.Errorf("case %s %s: shape %v (want %v), max diff %v (%d values)", c.Name, name, shape, ref.Shape, d, n)
		}
	}
	v, shape := read(t, jf.cond, "video_latents")
	c.Check(t, "video_latents", v, shape, c.Intermediate(t, "video_latents"))
	v, shape = read(t, jf.cond, "start_latent")
	c.Check(t, "start_latent", v, shape, c.Intermediate(t, "start_latent"))
	w := vc.window
	for i, f := range jf.sections {
		lat, shape := read(t, f, "history_latents")
		t0 := 0 // backward: the newest window is in front
		if vc.f1 {
			t0 = int(shape[2]) - w
		}
		got, s := framesT(lat, shape, t0, t0+w)
		c.Check(t, fmt.Sprintf("section%d_latents", i), got, s, c.Intermediate(t, fmt.Sprintf("section%d_latents", i)))
	}
	final := jf.sections[total-1]
	lat, shape, gen := readHistory(t, final)
	t0 := 0
	if vc.f1 {
		t0 = int(shape[2]) - gen
	}
	got, s := framesT(lat, shape, t0, t0+gen)
	c.Check(t, "history_latents", got, s, c.Output(t, "history_latents"))
	pshape := checkPixels(t, c, final)
	// The output: the input video's frames fitted to the bucket, then the generated ones.
	in, ishape := read(t, jf.cond, "input_frames")
	px, _ := read(t, final, "history_pixels")
	gu8, err := imageproc.VideoFrames(imageproc.Video{B: int(pshape[0]), C: int(pshape[1]), T: int(pshape[2]), H: int(pshape[3]), W: int(pshape[4]), Data: px})
	if err != nil {
		t.Fatal(err)
	}
	combined := append(append([]float32(nil), in...), bytesF32(gu8.Pix)...)
	want := c.Output(t, "combined_frames_u8") // [1, 3, T, H, W]
	wt := int(want.Shape[2])
	if int(ishape[0])+gu8.T != wt {
		t.Fatalf("output of %d input + %d generated frames, the reference %d", ishape[0], gu8.T, wt)
	}
	if d, n := parity.MaxAbsDiff(combined, thwcOf(want)); d > 1 {
		t.Errorf("case %s combined frames: max diff %v (%d values), want at most 1", c.Name, d, n)
	}
	if r := job.GetResult(); int(r.GetFrameCount()) != wt {
		t.Errorf("result frame count %d, want the input's and the generated ones: %d", r.GetFrameCount(), wt)
	}
	mp4 := job.GetResult().GetVideoPath()
	raw, err := os.ReadFile(strings.TrimSuffix(mp4, filepath.Ext(mp4)) + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var st pipeline.Settings
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	wantVariant := pipeline.VariantVideo
	if vc.f1 {
		wantVariant = pipeline.VariantVideoF1
	}
	if st.Variant != wantVariant || st.InputVideo == nil || st.InputVideo.SHA256 != job.GetSpec().GetInputVideoSha256() {
		t.Errorf("settings: variant %q, input video %+v", st.Variant, st.InputVideo)
	}
}

func bytesF32(b []byte) []float32 {
	out := make([]float32, len(b))
	for i, x := range b {
		out[i] = float32(x)
	}
	return out
}

// thwcOf lays a [1, 3, T, H, W] uint8 array out as [T, H, W, 3].
func thwcOf(a parity.Array) []float32 {
	t, h, w := int(a.Shape[2]), int(a.Shape[3]), int(a.Shape[4])
	out := make([]float32, 0, t*h*w*3)
	for ti := range t {
		for y := range h {
			for x := range w {
				for ch := range 3 {
					out = append(out, a.F32[((ch*t+ti)*h+y)*w+x])
				}
			}
		}
	}
	return out
}
