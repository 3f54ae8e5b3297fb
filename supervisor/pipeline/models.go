package pipeline

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/framepackd/framepackd/internal/hfhub"
)

// ErrModelsNotFound is returned (wrapped) by ResolveModels when a model folder is missing.
var ErrModelsNotFound = errors.New("pipeline: model folder not found")

// Models are the folders the workers load.
type Models struct {
	// HunyuanVideo is the HunyuanVideo snapshot: text_encoder/, text_encoder_2/, tokenizer/,
	// tokenizer_2/ (the textenc worker loads the folder) and vae/.
	HunyuanVideo string
	// FluxRedux is the FLUX Redux snapshot: image_encoder/ and feature_extractor/.
	FluxRedux string
	// Transformer is the FramePack I2V transformer folder (config.json and safetensors).
	Transformer string
	// TransformerF1 is the FramePack-F1 transformer folder; optional: empty when it is not
	// downloaded, and then jobs of variant f1 are refused at submit.
	TransformerF1 string
}

// VAE is the VAE folder inside the HunyuanVideo snapshot.
func (m Models) VAE() string { return filepath.Join(m.HunyuanVideo, "vae") }

// modelLayout names one model in each layout ResolveModels accepts.
type modelLayout struct {
	short string // the tiny test models' folder: <root>/<short>
	repo  string // the Hugging Face repository: <root>/<org>/<name> or the hub cache
	probe string // a file that must exist inside the folder
}

var (
	hunyuanLayout     = modelLayout{short: "hunyuanvideo", repo: "hunyuanvideo-community/HunyuanVideo", probe: "vae/config.json"}
	fluxReduxLayout   = modelLayout{short: "flux_redux_bfl", repo: "lllyasviel/flux_redux_bfl", probe: "image_encoder/config.json"}
	transformerLayout = modelLayout{short: "framepack_i2v", repo: "lllyasviel/FramePackI2V_HY", probe: "config.json"}
	// transformerF1Layout is FramePack-F1's transformer, optional.
	transformerF1Layout = modelLayout{short: "framepack_f1", repo: "lllyasviel/FramePack_F1_I2V_HY_20250503", probe: "config.json"}
)

// ResolveModels finds the three model folders under root. For each model it accepts, first
// found wins:
//
//   - <root>/<short>: the tiny test models' layout (testdata/parity/models): hunyuanvideo/,
//     flux_redux_bfl/, framepack_i2v/;
//   - <root>/<org>/<name>: a plain download of each repository (huggingface-cli download
//     --local-dir): hunyuanvideo-community/HunyuanVideo, lllyasviel/flux_redux_bfl,
//     lllyasviel/FramePackI2V_HY;
//   - the Hugging Face cache: <root>/models--<org>--<name>/snapshots/<rev>/ or the same under
//     <root>/hub/ (FramePack's own hf_download/ folder is such a root), the revision in
//     refs/main first, else the only snapshot.
func ResolveModels(root string) (Models, error) {
	if root == "" {
		return Models{}, fmt.Errorf("resolve models: %w: no model directory given", ErrModelsNotFound)
	}
	var m Models
	var errs []error
	for _, x := range []struct {
		dst *string
		l   modelLayout
	}{{&m.HunyuanVideo, hunyuanLayout}, {&m.FluxRedux, fluxReduxLayout}, {&m.Transformer, transformerLayout}} {
		dir, err := resolveModel(root, x.l)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		*x.dst = dir
	}
	if err := errors.Join(errs...); err != nil {
		return Models{}, fmt.Errorf("resolve models in %s: %w", root, err)
	}
	if dir, err := resolveModel(root, transformerF1Layout); err == nil {
		m.TransformerF1 = dir // optional: only variant f1 needs it
	}
	return m, nil
}

func resolveModel(root string, l modelLayout) (string, error) {
	org, name, _ := strings.Cut(l.repo, "/")
	cands := []string{filepath.Join(root, l.short), filepath.Join(root, org, name)}
	for _, hub := range []string{root, filepath.Join(root, "hub")} {
		if snap, ok := hubSnapshot(filepath.Join(hub, hfhub.RepoFolder(l.repo))); ok {
			cands = append(cands, snap)
		}
	}
	for _, c := range cands {
		if _, err := os.Stat(filepath.Join(c, l.probe)); err == nil {
			abs, err := filepath.Abs(c)
			if err != nil {
				return "", fmt.Errorf("model %s: %w", l.repo, err)
			}
			return abs, nil
		}
	}
	return "", fmt.Errorf("%w: %s (looked for %s in %s)", ErrModelsNotFound, l.repo, l.probe, strings.Join(cands, ", "))
}

// hubSnapshot returns the snapshot folder of a Hugging Face cache entry: the revision named by
// refs/main, else the only snapshot.
func hubSnapshot(entry string) (string, bool) {
	ref, _ := os.ReadFile(filepath.Join(entry, "refs", "main"))
	name, ok := hfhub.EntrySnapshot(entry, strings.TrimSpace(string(ref)))
	if !ok {
		return "", false
	}
	return filepath.Join(entry, "snapshots", name), true
}
