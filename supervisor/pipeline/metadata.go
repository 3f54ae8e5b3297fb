package pipeline

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// Settings are a job's settings as its videos carry them (the MP4's "comment" tag and a JSON
// file beside each video): enough to make the video again.
type Settings struct {
	Job            string              `json:"job"`
	Section        int                 `json:"section"`
	Sections       int                 `json:"sections"`
	Variant        string              `json:"variant"`
	Preset         string              `json:"preset,omitempty"`   // the preset the settings came from
	BatchID        string              `json:"batch_id,omitempty"` // the batch the job belongs to
	Prompt         string              `json:"prompt"`
	Prompts        []SettingsPrompt    `json:"prompts,omitempty"` // a timed prompt's entries
	NegativePrompt string              `json:"negative_prompt,omitempty"`
	Seed           int64               `json:"seed"`
	Seconds        float32             `json:"total_second_length"`
	Window         uint32              `json:"latent_window_size"`
	Steps          uint32              `json:"steps"`
	CFG            float32             `json:"cfg"`
	GS             float32             `json:"gs"`
	RS             float32             `json:"rs"`
	TeaCache       bool                `json:"use_teacache"`
	Cache          string              `json:"cache"`
	MagCache       *SettingsMagCache   `json:"magcache,omitempty"`
	Resolution     uint32              `json:"resolution"`
	Width          int                 `json:"width"`
	Height         int                 `json:"height"`
	Loras          []SettingsLora      `json:"loras,omitempty"`
	EndFrame       *SettingsEndFrame   `json:"end_frame,omitempty"`
	Keyframes      []SettingsKeyframe  `json:"keyframes,omitempty"`
	InputVideo     *SettingsInputVideo `json:"input_video,omitempty"`
	Weights        *SettingsWeights    `json:"weights,omitempty"`
	Models         map[string]string   `json:"models"` // model → revision (hub snapshot) or folder
}

// SettingsPrompt is one entry of a timed prompt.
type SettingsPrompt struct {
	Start  float64 `json:"start_seconds"`
	Prompt string  `json:"prompt"`
}

// SettingsMagCache is a job's MagCache settings and the calibration table its transformer
// reads.
type SettingsMagCache struct {
	Threshold           float64 `json:"threshold"`
	MaxConsecutiveSkips uint32  `json:"max_consecutive_skips"`
	RetentionRatio      float64 `json:"retention_ratio"`
	Calibration         string  `json:"calibration"`
}

// SettingsEndFrame is a job's end frame (JobSpec.end_image): which image, where the server
// keeps it, and its strength.
type SettingsEndFrame struct {
	SHA256   string  `json:"sha256"`
	Image    string  `json:"image"`
	Strength float32 `json:"strength"`
}

// SettingsKeyframe is one of a job's keyframes: the section it belongs to (video time), how
// the job gave it (section or seconds), which image and where the server keeps it.
type SettingsKeyframe struct {
	Section int      `json:"section"`
	Seconds *float32 `json:"seconds,omitempty"`
	SHA256  string   `json:"sha256"`
	Image   string   `json:"image"`
}

// SettingsInputVideo is the video a job extends: which file, where the server keeps it, the
// job it came from (when it did), its decoded frames, the context frames and whether the output
// starts with its frames.
type SettingsInputVideo struct {
	SHA256        string `json:"sha256"`
	Video         string `json:"video"`
	JobID         string `json:"job_id,omitempty"`
	Frames        int    `json:"frames,omitempty"`
	ContextFrames int    `json:"context_frames"`
	IncludeInput  bool   `json:"include_input"`
}

// SettingsWeights is how a job's transformer held its weights when they were not the model
// folder's 16-bit ones: the job's choices and the 8-bit format the transformer reported.
type SettingsWeights struct {
	Checkpoint string `json:"checkpoint,omitempty"` // JobSpec.transformer_checkpoint
	Quantize   string `json:"quantize,omitempty"`   // JobSpec.weights ("fp8")
	Format     string `json:"format,omitempty"`     // plain, comfy, musubi, quantized
	FP8Compute string `json:"fp8_compute,omitempty"`
}

// SettingsLora is one LoRA of a job, with what the transformer reported merging.
type SettingsLora struct {
	Path           string  `json:"path"`
	Strength       float64 `json:"strength"`
	Format         string  `json:"format,omitempty"`
	WeightsChanged uint32  `json:"weights_changed,omitempty"`
}

// settings returns the job's settings after section i.
func (j *jobRun) settings(i int) Settings {
	spec := j.job.Spec
	s := Settings{Job: j.job.ID, Section: i, Sections: j.total, Variant: j.variant.Name(), Prompt: spec.GetPrompt(),
		NegativePrompt: spec.GetNegativePrompt(), Seed: spec.GetSeed(), Seconds: spec.GetTotalSecondLength(),
		Window: spec.GetLatentWindowSize(), Steps: spec.GetSteps(), CFG: spec.GetCfg(), GS: spec.GetGs(), RS: spec.GetRs(),
		Resolution: spec.GetResolution(), Models: map[string]string{}}
	s.Preset, s.BatchID = spec.GetPreset(), spec.GetBatchId()
	s.Cache = plan.SpecCache(spec)
	s.TeaCache = s.Cache == plan.CacheTeaCache
	if m := j.magCache(); m != nil {
		s.MagCache = &SettingsMagCache{Threshold: m.Threshold, MaxConsecutiveSkips: m.MaxConsecutiveSkips,
			RetentionRatio: spec.GetMagcacheRetentionRatio(), Calibration: map[workerkit.MagCacheCalibration]string{
				workerkit.MagCacheFramePack: "framepack", workerkit.MagCacheFramePackF1: "framepack_f1"}[m.Calibration]}
	}
	if j.cond != nil {
		s.Width, s.Height = j.cond.width, j.cond.height
	}
	if plan.IsTimed(spec.GetPrompt()) {
		if ps, err := plan.ParsePrompts(spec.GetPrompt()); err == nil {
			for _, p := range ps {
				s.Prompts = append(s.Prompts, SettingsPrompt{Start: p.Start, Prompt: p.Prompt})
			}
		}
	}
	if spec.GetTransformerCheckpoint() != "" || spec.GetWeights() != "" || j.weightsFormat != "" {
		s.Weights = &SettingsWeights{Checkpoint: spec.GetTransformerCheckpoint(), Quantize: spec.GetWeights(), Format: j.weightsFormat,
			FP8Compute: j.fp8Compute}
	}
	if j.job.EndImagePath != "" {
		s.EndFrame = &SettingsEndFrame{SHA256: spec.GetEndImageSha256(), Image: j.job.EndImagePath, Strength: spec.GetEndStrength()}
	}
	if secs, err := plan.KeyframeSections(spec); err == nil {
		for i, k := range spec.GetKeyframes() {
			sk := SettingsKeyframe{Section: secs[i], SHA256: k.GetImageSha256()}
			if t, ok := k.GetAt().(*framepackv1.Keyframe_Seconds); ok {
				sk.Seconds = &t.Seconds
			}
			if i < len(j.job.KeyframePaths) {
				sk.Image = j.job.KeyframePaths[i]
			}
			s.Keyframes = append(s.Keyframes, sk)
		}
	}
	if j.job.VideoPath != "" {
		s.InputVideo = &SettingsInputVideo{SHA256: spec.GetInputVideoSha256(), Video: j.job.VideoPath, JobID: spec.GetInputVideoJobId(),
			ContextFrames: int(spec.GetVideoContextFrames()), IncludeInput: spec.GetVideoIncludeInput()}
		if j.cond != nil {
			s.InputVideo.Frames = j.cond.videoFrames
		}
	}
	for k, l := range jobLoras(spec) {
		sl := SettingsLora{Path: l.Path, Strength: l.Strength}
		if k < len(j.lorasApplied) && j.lorasApplied[k].Path == l.Path {
			sl.Format, sl.WeightsChanged = j.lorasApplied[k].Format, j.lorasApplied[k].WeightsChanged
		}
		s.Loras = append(s.Loras, sl)
	}
	m := j.r.cfg.Models
	for name, dir := range map[string]string{"hunyuanvideo": m.HunyuanVideo, "flux_redux": m.FluxRedux, "transformer": j.r.transformerDir(s.Variant)} {
		s.Models[name] = revision(dir)
	}
	return s
}

// revision is a model folder's revision: the snapshot name of a Hugging Face cache folder
// (…/snapshots/<revision>), else the folder itself.
func revision(dir string) string {
	parent, rev := filepath.Split(filepath.Clean(dir))
	if filepath.Base(filepath.Clean(parent)) == "snapshots" {
		return rev
	}
	return dir
}

// writeSettings writes the settings as JSON beside a video: <video without extension>.json.
func writeSettings(videoPath string, raw []byte) error {
	path := settingsPath(videoPath)
	if err := os.WriteFile(path+".partial", append(raw, '\n'), 0o644); err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	if err := os.Rename(path+".partial", path); err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	return nil
}

// settingsPath is the settings file beside a section video: section-NNN.json.
func settingsPath(videoPath string) string {
	return strings.TrimSuffix(videoPath, filepath.Ext(videoPath)) + ".json"
}
