package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/framepackd/framepackd/internal/imageproc"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// specFlags are the job settings flags generate and batch share, and the spec they build.
type specFlags struct {
	fs *flag.FlagSet
	// parent, when set, holds the settings these start from (a batch's command line under an
	// item's own): its flags count as given too.
	parent *specFlags

	prompt, promptFile, negative, lane, variant, endImage, cache, preset string
	seconds, cfg, gs, rs, gpuPreserve, endStrength                       float64
	magThreshold, magRetention                                           float64
	seed                                                                 int64
	steps, window, resolution, crf, magSkips                             uint
	teacache                                                             bool
	loras                                                                loraFlags
	keyframes                                                            keyframeFlags
	inputVideo, extendJob                                                string
	videoContext                                                         uint
	videoInput                                                           bool
	keepAlive                                                            time.Duration
	weights, checkpoint, fp8Compute                                      string
}

// register adds the settings flags to fs.
func (f *specFlags) register(fs *flag.FlagSet) {
	f.fs = fs
	fs.StringVar(&f.prompt, "prompt", "", "what should happen (this or --prompt-file is required)")
	fs.StringVar(&f.promptFile, "prompt-file", "", "read the prompt from this file ('-': standard input)")
	fs.StringVar(&f.negative, "negative-prompt", "", "negative prompt (used when --cfg > 1)")
	// The defaults are the server's (supervisor/pipeline/plan, jobs), which it also gives jobs
	// that leave a setting unset; the resolution is left to the server, whose models decide it.
	fs.Float64Var(&f.seconds, "seconds", 5, "video length in seconds, (0, 120]")
	fs.Int64Var(&f.seed, "seed", plan.DefaultSeed, "sampler seed")
	fs.UintVar(&f.steps, "steps", plan.DefaultSteps, "sampling steps per section, 1–100")
	fs.UintVar(&f.window, "window", plan.DefaultLatentWindowSize, "latent window size, 1–33")
	fs.Float64Var(&f.cfg, "cfg", plan.DefaultCFG, "real guidance scale, 1–32 (1: no negative pass)")
	fs.Float64Var(&f.gs, "gs", plan.DefaultGS, "distilled guidance scale, 1–32")
	fs.Float64Var(&f.rs, "rs", 0, "guidance rescale, 0–1")
	fs.BoolVar(&f.teacache, "teacache", plan.DefaultUseTeaCache, "use TeaCache (faster, slightly different output); --teacache=false is --cache none")
	fs.StringVar(&f.cache, "cache", plan.DefaultCache, "step cache: teacache, magcache (FramePack-Studio's MagCache) or none")
	fs.Float64Var(&f.magThreshold, "magcache-threshold", plan.DefaultMagCacheThreshold, "MagCache's error threshold, 0.01–1 (with --cache magcache)")
	fs.UintVar(&f.magSkips, "magcache-max-skips", plan.DefaultMagCacheMaxSkips, "most steps MagCache skips in a row, 1–5 (with --cache magcache)")
	fs.Float64Var(&f.magRetention, "magcache-retention", plan.DefaultMagCacheRetentionRatio, "share of each section's first steps MagCache always runs, 0–1 (with --cache magcache)")
	fs.UintVar(&f.resolution, "resolution", 0, "bucket resolution: 640 (FramePack's table) or 96 (the tiny test models'); default: the served models' own")
	fs.UintVar(&f.crf, "crf", plan.DefaultMP4CRF, "H.264 constant rate factor, 0–51")
	fs.Float64Var(&f.gpuPreserve, "gpu-preserve", plan.DefaultGPUMemoryPreservationGB, "GB of GPU memory to leave free, 0–128")
	fs.StringVar(&f.lane, "lane", "", "run on this lane (see framepack devices)")
	fs.Var(&f.loras, "lora", "LoRA file merged into the transformer, PATH or PATH:STRENGTH (strength -4–4, default 1); repeat to stack")
	fs.StringVar(&f.variant, "variant", "i2v", "sampling loop: i2v (FramePack, backwards in time) or f1 (FramePack-F1, forwards)")
	fs.StringVar(&f.endImage, "end-image", "", "end frame the video should reach: PNG, JPEG or WebP (FramePack-Studio's end frame; i2v only)")
	fs.Float64Var(&f.endStrength, "end-strength", plan.DefaultEndStrength, "how strongly the end frame pulls, 0–1 (with --end-image)")
	fs.StringVar(&f.preset, "preset", "", "start from this preset's settings (framepack presets list); the flags given override them")
	fs.StringVar(&f.inputVideo, "input-video", "", "extend this video instead of starting from an image (FramePack-Studio's Video / Video F1 with --variant f1): MP4, WebM, MKV or MOV")
	fs.StringVar(&f.extendJob, "extend-job", "", "extend the video of this finished job (on the server) instead of starting from an image")
	fs.UintVar(&f.videoContext, "video-context-frames", 5, "latent frames of the video's end the first sections hold on to, 1–10 (2–10 with f1; with --input-video or --extend-job)")
	fs.BoolVar(&f.videoInput, "video-include-input", true, "the output starts with the input video's frames (with --input-video or --extend-job)")
	fs.StringVar(&f.weights, "weights", "", "transformer weights: empty as stored, or fp8 to quantize them to float8 at load (half the memory)")
	fs.StringVar(&f.checkpoint, "transformer-checkpoint", "", "single-file transformer weights on the server (FramePack's, or an fp8 file from ComfyUI or musubi-tuner)")
	fs.StringVar(&f.fp8Compute, "fp8-compute", "", "products with fp8 weights: weight_only (default), tensor or token (fp8 activations on the matrix units)")
	fs.DurationVar(&f.keepAlive, "keep-alive", -1, "how long the job's model workers stay alive after it for the next job (0: killed at once; default: the server's --keep-alive)")
	fs.Var(&f.keyframes, "keyframe", "a section's image, SECTION:PATH (0-based, in video time) or SECONDSs:PATH (the first section starting at or after it); repeat for more (FramePack-eichi's keyframes; i2v only)")
}

// given reports whether the flag was on the command line.
func (f *specFlags) given(name string) bool {
	set := false
	f.fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set || f.parent != nil && f.parent.given(name)
}

// readPrompt fills in the prompt from --prompt-file.
func (f *specFlags) readPrompt(cmd string) error {
	if f.promptFile == "" {
		return nil
	}
	if f.prompt != "" {
		return fail(exitUsage, "%s: give --prompt or --prompt-file, not both", cmd)
	}
	var raw []byte
	var err error
	if f.promptFile == "-" {
		raw, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	} else {
		raw, err = os.ReadFile(f.promptFile)
	}
	if err != nil {
		return fail(exitError, "read --prompt-file: %v", err)
	}
	f.prompt = strings.TrimSpace(string(raw))
	if f.prompt == "" {
		return fail(exitUsage, "%s: --prompt-file %s is empty", cmd, f.promptFile)
	}
	f.promptFile = "" // read once
	return nil
}

// spec builds the job spec the flags ask for (the prompt read, the end image loaded).
func (f *specFlags) spec(cmd string) (*framepackv1.JobSpec, error) {
	if f.given("end-strength") && f.endImage == "" {
		return nil, fail(exitUsage, "%s: --end-strength needs --end-image", cmd)
	}
	// The API reads 0 as "the default" for these; on the command line 0 is a mistake, refused
	// here with the range (the server checks every other out-of-range value the same way).
	for _, r := range []struct {
		flag     string
		v        float64
		min, max float64
	}{{"--steps", float64(f.steps), 1, 100}, {"--window", float64(f.window), 1, 33}, {"--cfg", f.cfg, 1, 32}, {"--gs", f.gs, 1, 32}, {"--resolution", float64(f.resolution), 16, 2048}} {
		if r.v == 0 && (r.flag != "--resolution" || f.given("resolution")) {
			return nil, fail(exitUsage, "%s: %s must be %g to %g, got 0", cmd, r.flag, r.min, r.max)
		}
	}
	if err := f.readPrompt(cmd); err != nil {
		return nil, err
	}
	spec := &framepackv1.JobSpec{
		Prompt:                  f.prompt,
		NegativePrompt:          f.negative,
		Seed:                    proto.Int64(f.seed),
		TotalSecondLength:       float32(f.seconds),
		LatentWindowSize:        uint32(min(f.window, 1<<31)),
		Steps:                   uint32(min(f.steps, 1<<31)),
		Cfg:                     float32(f.cfg),
		Gs:                      float32(f.gs),
		Rs:                      float32(f.rs),
		Resolution:              uint32(min(f.resolution, 1<<31)),
		Mp4Crf:                  proto.Uint32(uint32(min(f.crf, 1<<31))),
		GpuMemoryPreservationGb: proto.Float32(float32(f.gpuPreserve)),
		Lane:                    f.lane,
		Loras:                   f.loras,
		Variant:                 f.variant,
		Weights:                 f.weights,
		TransformerCheckpoint:   absPath(f.checkpoint),
		Fp8Compute:              f.fp8Compute,
	}
	if f.keepAlive >= 0 {
		spec.KeepAlive = durationpb.New(f.keepAlive)
	}
	if err := f.cacheSpec(cmd, spec); err != nil {
		return nil, err
	}
	if f.preset != "" {
		// Only what the command line says: the server fills the rest from the preset.
		f.keepGiven(spec)
		spec.Preset = f.preset
	}
	if err := f.videoSpec(cmd, spec); err != nil {
		return nil, err
	}
	for _, k := range f.keyframes {
		img, err := readImageFile(k.path, "keyframe")
		if err != nil {
			return nil, err
		}
		kf := &framepackv1.Keyframe{Image: img}
		if k.seconds != nil {
			kf.At = &framepackv1.Keyframe_Seconds{Seconds: *k.seconds}
		} else {
			kf.At = &framepackv1.Keyframe_Section{Section: k.section}
		}
		spec.Keyframes = append(spec.Keyframes, kf)
	}
	if f.endImage != "" {
		end, err := readImageFile(f.endImage, "end image")
		if err != nil {
			return nil, err
		}
		spec.EndImage, spec.EndStrength = end, proto.Float32(float32(f.endStrength))
	}
	return spec, nil
}

// cacheSpec sets the spec's step cache from --cache, --teacache and the --magcache-* flags.
func (f *specFlags) cacheSpec(cmd string, spec *framepackv1.JobSpec) error {
	cache := f.cache
	if f.given("teacache") {
		switch {
		case !f.given("cache"):
			cache = "none"
			if f.teacache {
				cache = "teacache"
			}
		case f.teacache != (cache == "teacache"):
			return fail(exitUsage, "%s: --teacache=%v contradicts --cache %s: give --cache alone", cmd, f.teacache, cache)
		}
	}
	spec.Cache = cache
	mag := false
	for _, name := range []string{"magcache-threshold", "magcache-max-skips", "magcache-retention"} {
		mag = mag || f.given(name)
	}
	if cache != "magcache" {
		if mag {
			return fail(exitUsage, "%s: the --magcache-* flags need --cache magcache", cmd)
		}
		return nil
	}
	spec.MagcacheThreshold = proto.Float64(f.magThreshold)
	spec.MagcacheMaxConsecutiveSkips = proto.Uint32(uint32(min(f.magSkips, 1<<31)))
	spec.MagcacheRetentionRatio = proto.Float64(f.magRetention)
	return nil
}

// readImageFile reads a PNG, JPEG or WebP file, saying which (what) when it is not one.
func readImageFile(path, what string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fail(exitError, "read %s: %v", what, err)
	}
	if imageproc.Sniff(b) == "" {
		// Say it here, with the file name; the server would say "not a usable image".
		return nil, fail(exitRejected, "%s is not a PNG, JPEG or WebP image", path)
	}
	return b, nil
}

// settingFields names, for each settings flag, what it sets in a spec and how to unset it.
var settingFields = []struct {
	flags []string
	clear func(*framepackv1.JobSpec)
}{
	{[]string{"prompt", "prompt-file"}, func(s *framepackv1.JobSpec) { s.Prompt = "" }},
	{[]string{"negative-prompt"}, func(s *framepackv1.JobSpec) { s.NegativePrompt = "" }},
	{[]string{"seconds"}, func(s *framepackv1.JobSpec) { s.TotalSecondLength = 0 }},
	{[]string{"seed"}, func(s *framepackv1.JobSpec) { s.Seed = nil }},
	{[]string{"steps"}, func(s *framepackv1.JobSpec) { s.Steps = 0 }},
	{[]string{"window"}, func(s *framepackv1.JobSpec) { s.LatentWindowSize = 0 }},
	{[]string{"cfg"}, func(s *framepackv1.JobSpec) { s.Cfg = 0 }},
	{[]string{"gs"}, func(s *framepackv1.JobSpec) { s.Gs = 0 }},
	{[]string{"rs"}, func(s *framepackv1.JobSpec) { s.Rs = 0 }},
	{[]string{"cache", "teacache"}, func(s *framepackv1.JobSpec) { s.Cache, s.UseTeacache = "", nil }},
	{[]string{"magcache-threshold"}, func(s *framepackv1.JobSpec) { s.MagcacheThreshold = nil }},
	{[]string{"magcache-max-skips"}, func(s *framepackv1.JobSpec) { s.MagcacheMaxConsecutiveSkips = nil }},
	{[]string{"magcache-retention"}, func(s *framepackv1.JobSpec) { s.MagcacheRetentionRatio = nil }},
	{[]string{"resolution"}, func(s *framepackv1.JobSpec) { s.Resolution = 0 }},
	{[]string{"crf"}, func(s *framepackv1.JobSpec) { s.Mp4Crf = nil }},
	{[]string{"gpu-preserve"}, func(s *framepackv1.JobSpec) { s.GpuMemoryPreservationGb = nil }},
	{[]string{"weights"}, func(s *framepackv1.JobSpec) { s.Weights = "" }},
	{[]string{"transformer-checkpoint"}, func(s *framepackv1.JobSpec) { s.TransformerCheckpoint = "" }},
	{[]string{"fp8-compute"}, func(s *framepackv1.JobSpec) { s.Fp8Compute = "" }},
	{[]string{"keep-alive"}, func(s *framepackv1.JobSpec) { s.KeepAlive = nil }},
	{[]string{"lane"}, func(s *framepackv1.JobSpec) { s.Lane = "" }},
	{[]string{"lora"}, func(s *framepackv1.JobSpec) { s.Loras = nil }},
	{[]string{"variant"}, func(s *framepackv1.JobSpec) { s.Variant = "" }},
	{[]string{"end-image"}, func(s *framepackv1.JobSpec) { s.EndImage = nil }},
	{[]string{"end-strength"}, func(s *framepackv1.JobSpec) { s.EndStrength = nil }},
	{[]string{"keyframe"}, func(s *framepackv1.JobSpec) { s.Keyframes = nil }},
	{[]string{"input-video"}, func(s *framepackv1.JobSpec) { s.InputVideo = nil }},
	{[]string{"extend-job"}, func(s *framepackv1.JobSpec) { s.InputVideoJobId = "" }},
	{[]string{"video-context-frames"}, func(s *framepackv1.JobSpec) { s.VideoContextFrames = nil }},
	{[]string{"video-include-input"}, func(s *framepackv1.JobSpec) { s.VideoIncludeInput = nil }},
}

// keepGiven unsets every setting of spec whose flag was not on the command line.
func (f *specFlags) keepGiven(spec *framepackv1.JobSpec) {
	for _, sf := range settingFields {
		given := false
		for _, name := range sf.flags {
			given = given || f.given(name)
		}
		if !given {
			sf.clear(spec)
		}
	}
}

// anyGiven reports whether any settings flag was on the command line.
func (f *specFlags) anyGiven() bool {
	for _, sf := range settingFields {
		for _, name := range sf.flags {
			if f.given(name) {
				return true
			}
		}
	}
	return false
}

// keyframeFlag is one --keyframe: a section (or a time) and an image file.
type keyframeFlag struct {
	section uint32
	seconds *float32
	path    string
}

// keyframeFlags collects repeated --keyframe SECTION:PATH or SECONDSs:PATH flags.
type keyframeFlags []keyframeFlag

// String lists the keyframes as given.
func (k *keyframeFlags) String() string {
	parts := make([]string, len(*k))
	for i, x := range *k {
		if x.seconds != nil {
			parts[i] = fmt.Sprintf("%gs:%s", *x.seconds, x.path)
		} else {
			parts[i] = fmt.Sprintf("%d:%s", x.section, x.path)
		}
	}
	return strings.Join(parts, ",")
}

// Set adds one keyframe: SECTION:PATH or SECONDSs:PATH.
func (k *keyframeFlags) Set(v string) error {
	at, path, ok := strings.Cut(v, ":")
	if !ok || path == "" {
		return fmt.Errorf("want SECTION:PATH or SECONDSs:PATH, got %q", v)
	}
	x := keyframeFlag{path: path}
	if t, isTime := strings.CutSuffix(at, "s"); isTime {
		f, err := strconv.ParseFloat(t, 32)
		if err != nil || f < 0 {
			return fmt.Errorf("%q: want seconds like 2.5s", at)
		}
		s := float32(f)
		x.seconds = &s
	} else {
		n, err := strconv.ParseUint(at, 10, 31)
		if err != nil {
			return fmt.Errorf("%q: want a section number (0 is the first) or seconds like 2.5s", at)
		}
		x.section = uint32(n)
	}
	*k = append(*k, x)
	return nil
}

// extends reports whether the flags ask to extend a video.
func (f *specFlags) extends() bool { return f.inputVideo != "" || f.extendJob != "" }

// videoSpec sets the input video (read from --input-video, or --extend-job's id) and its
// settings, sent only when given.
func (f *specFlags) videoSpec(cmd string, spec *framepackv1.JobSpec) error {
	if !f.extends() {
		for _, name := range []string{"video-context-frames", "video-include-input"} {
			if f.given(name) {
				return fail(exitUsage, "%s: --%s needs --input-video or --extend-job", cmd, name)
			}
		}
		return nil
	}
	if f.inputVideo != "" && f.extendJob != "" {
		return fail(exitUsage, "%s: give --input-video or --extend-job, not both", cmd)
	}
	if f.inputVideo != "" {
		b, err := os.ReadFile(f.inputVideo)
		if err != nil {
			return fail(exitError, "read input video: %v", err)
		}
		spec.InputVideo = b
	}
	spec.InputVideoJobId = f.extendJob
	if f.given("video-context-frames") {
		spec.VideoContextFrames = proto.Uint32(uint32(min(f.videoContext, 1<<31)))
	}
	if f.given("video-include-input") {
		spec.VideoIncludeInput = proto.Bool(f.videoInput)
	}
	return nil
}
