package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// FullTransformerWidth is the hidden size of FramePack's real transformer (24 heads × 128).
const FullTransformerWidth = 3072

// ModelInfo is what CheckModels learned about the model folders.
type ModelInfo struct {
	// TransformerWidth is the transformer's hidden size (num_attention_heads ×
	// attention_head_dim).
	TransformerWidth int
}

// Small reports whether the models are smaller than FramePack's (the tiny test models): they
// were trained at other sizes, so a job must say its resolution instead of taking 640.
func (i ModelInfo) Small() bool { return i.TransformerWidth < FullTransformerWidth }

// NativeResolution is the bucket table the models were made for, the resolution of a job
// that names none: FramePack's 640, or the tiny test models' 96 (api.ModelFit).
func (i ModelInfo) NativeResolution() uint32 {
	if i.Small() {
		return plan.TinyResolution
	}
	return plan.FramePackResolution
}

// FitResolution says why the models cannot take a job fitted to the known bucket table of
// resolution: models smaller than FramePack's take only their own table (at 640 the tiny test
// models need minutes a section on a CPU, for a size they were not made for). FramePack's
// models take every table; a resolution with no known table is the validation's to refuse.
func (i ModelInfo) FitResolution(resolution uint32) error {
	if !i.Small() || resolution == i.NativeResolution() {
		return nil
	}
	if _, known := plan.KnownTable(int(resolution)); !known {
		return nil
	}
	return fmt.Errorf("the server's models are not FramePack's full-size ones (transformer width %d, FramePack's is %d), so resolution %d does not fit them: use %d (framepack generate --resolution %d, or leave the resolution out to get the models' own) or give buckets",
		i.TransformerWidth, FullTransformerWidth, resolution, i.NativeResolution(), i.NativeResolution())
}

// CheckModels checks that every model folder a job loads is usable before a job is accepted:
// its config.json parses and each of its safetensors files has a header that parses (the
// tensors themselves are checked when a worker loads them). The error names every bad file.
func CheckModels(m Models) (ModelInfo, error) {
	var info ModelInfo
	var errs []error
	for _, dir := range []string{
		filepath.Join(m.HunyuanVideo, "text_encoder"), filepath.Join(m.HunyuanVideo, "text_encoder_2"),
		m.VAE(), filepath.Join(m.FluxRedux, "image_encoder"), m.Transformer,
	} {
		if err := checkModelDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	var cfg struct {
		Heads   int `json:"num_attention_heads"`
		HeadDim int `json:"attention_head_dim"`
	}
	if raw, err := os.ReadFile(filepath.Join(m.Transformer, "config.json")); err == nil && json.Unmarshal(raw, &cfg) == nil {
		info.TransformerWidth = cfg.Heads * cfg.HeadDim
	}
	if err := errors.Join(errs...); err != nil {
		return info, fmt.Errorf("check models: %w", err)
	}
	return info, nil
}

func checkModelDir(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return fmt.Errorf("model %s: %w", dir, err)
	}
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("model %s: config.json is not JSON: %w", dir, err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("model %s: no .safetensors weights", dir)
	}
	var errs []error
	for _, p := range files {
		if err := checkHeader(p); err != nil {
			errs = append(errs, fmt.Errorf("model weights %s: %w (download the file again)", p, err))
		}
	}
	return errors.Join(errs...)
}

// checkHeader parses a safetensors file's header without reading its tensors.
func checkHeader(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	_, err = safetensors.ReadHeader(f, st.Size())
	return err
}
