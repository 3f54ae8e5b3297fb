package hfhub

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Component is a folder of a repository that the pipeline loads ("" is the repository's top).
type Component struct {
	// Dir is the folder in the repository; "" for the top level.
	Dir string
	// Files must be there.
	Files []string
	// Weights: the folder holds safetensors weights, one file or shards listed by a
	// *.safetensors.index.json.
	Weights bool
}

// RepoSpec is a repository of the FramePack pipeline and the parts of it the pipeline needs.
type RepoSpec struct {
	// Repo is "org/name".
	Repo string
	// Components are the folders pulled (and checked by Check).
	Components []Component
}

// The repositories FramePack's pipelines load (demo_gradio.py, demo_gradio_f1.py).
var (
	// HunyuanVideo: the text encoders, their tokenizers and the VAE; not its transformer.
	HunyuanVideo = RepoSpec{Repo: "hunyuanvideo-community/HunyuanVideo", Components: []Component{
		{Dir: "text_encoder", Files: []string{"config.json"}, Weights: true},
		{Dir: "text_encoder_2", Files: []string{"config.json"}, Weights: true},
		{Dir: "tokenizer", Files: []string{"tokenizer.json", "tokenizer_config.json"}},
		{Dir: "tokenizer_2", Files: []string{"vocab.json", "merges.txt", "tokenizer_config.json"}},
		{Dir: "vae", Files: []string{"config.json"}, Weights: true},
	}}
	// FluxRedux: the SigLIP image encoder and its preprocessor.
	FluxRedux = RepoSpec{Repo: "lllyasviel/flux_redux_bfl", Components: []Component{
		{Dir: "feature_extractor", Files: []string{"preprocessor_config.json"}},
		{Dir: "image_encoder", Files: []string{"config.json"}, Weights: true},
	}}
	// FramePackI2V is the packed transformer of FramePack's image-to-video model.
	FramePackI2V = RepoSpec{Repo: "lllyasviel/FramePackI2V_HY", Components: []Component{{Files: []string{"config.json"}, Weights: true}}}
	// FramePackF1 is the packed transformer of FramePack-F1.
	FramePackF1 = RepoSpec{Repo: "lllyasviel/FramePack_F1_I2V_HY_20250503", Components: []Component{{Files: []string{"config.json"}, Weights: true}}}
)

// Variants are the pipelines and the repositories each needs.
var Variants = map[string][]RepoSpec{
	"i2v": {HunyuanVideo, FluxRedux, FramePackI2V},
	"f1":  {HunyuanVideo, FluxRedux, FramePackF1},
}

// VariantNames lists Variants' keys in order (i2v first).
func VariantNames() []string {
	names := make([]string, 0, len(Variants))
	for n := range Variants {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] > names[j] }) // "i2v" before "f1"
	return names
}

// KnownRepos are every repository of every variant, each once, in a fixed order.
func KnownRepos() []RepoSpec {
	var out []RepoSpec
	seen := map[string]bool{}
	for _, v := range VariantNames() {
		for _, r := range Variants[v] {
			if !seen[r.Repo] {
				seen[r.Repo] = true
				out = append(out, r)
			}
		}
	}
	return out
}

// Wants returns what to pull for the given variants (each repository once), at revision rev
// (empty: main).
func Wants(variants []string, rev string) ([]Want, error) {
	var out []Want
	seen := map[string]bool{}
	for _, v := range variants {
		specs, ok := Variants[v]
		if !ok {
			return nil, fmt.Errorf("unknown variant %q (want one of %s)", v, strings.Join(VariantNames(), ", "))
		}
		for _, s := range specs {
			if !seen[s.Repo] {
				seen[s.Repo] = true
				out = append(out, s.Want(rev))
			}
		}
	}
	return out, nil
}

// Want selects the spec's components: every file of each component folder; at the top level,
// the config, the weights and their index.
func (r RepoSpec) Want(rev string) Want {
	w := Want{Repo: r.Repo, Revision: rev}
	for _, c := range r.Components {
		if c.Dir != "" {
			w.Include = append(w.Include, c.Dir+"/")
			continue
		}
		w.Include = append(w.Include, c.Files...)
		if c.Weights {
			w.Include = append(w.Include, "*.safetensors")
			w.Optional = append(w.Optional, "*.safetensors.index.json")
		}
	}
	return w
}

// Check lists what the snapshot folder dir lacks for this spec (nothing: complete). Links to
// missing blobs count as missing.
func (r RepoSpec) Check(dir string) []string {
	var missing []string
	for _, c := range r.Components {
		cdir := filepath.Join(dir, c.Dir)
		for _, f := range c.Files {
			if !isFile(filepath.Join(cdir, f)) {
				missing = append(missing, filepath.ToSlash(filepath.Join(c.Dir, f)))
			}
		}
		if c.Weights {
			missing = append(missing, checkWeights(cdir, c.Dir)...)
		}
	}
	return missing
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// checkWeights checks that a folder has its weights: every shard its index names, else one
// safetensors file.
func checkWeights(dir, rel string) []string {
	name := func(f string) string { return filepath.ToSlash(filepath.Join(rel, f)) }
	idx, _ := filepath.Glob(filepath.Join(dir, "*.safetensors.index.json"))
	if len(idx) > 0 {
		var missing []string
		for _, ix := range idx {
			b, err := os.ReadFile(ix)
			if err != nil {
				missing = append(missing, name(filepath.Base(ix)))
				continue
			}
			var index struct {
				WeightMap map[string]string `json:"weight_map"`
			}
			if err := json.Unmarshal(b, &index); err != nil || len(index.WeightMap) == 0 {
				missing = append(missing, name(filepath.Base(ix))+" (unreadable)")
				continue
			}
			shards := map[string]bool{}
			for _, s := range index.WeightMap {
				shards[s] = true
			}
			for s := range shards {
				if filepath.Base(s) != s || !isFile(filepath.Join(dir, s)) {
					missing = append(missing, name(s))
				}
			}
		}
		sort.Strings(missing)
		return missing
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	for _, f := range files {
		if isFile(f) {
			return nil
		}
	}
	return []string{name("*.safetensors")}
}

// RepoStatus is one repository of a variant as found in a cache.
type RepoStatus struct {
	// Spec is the repository.
	Spec RepoSpec
	// Commit is the snapshot used (refs/main, else the only snapshot); empty when none.
	Commit string
	// Dir is the snapshot folder; empty when none.
	Dir string
	// Missing lists what the snapshot lacks.
	Missing []string
}

// Complete reports whether the repository has everything the pipeline needs.
func (s RepoStatus) Complete() bool { return s.Dir != "" && len(s.Missing) == 0 }

// Status checks every known repository in the cache at revision rev (empty: main).
func (c Cache) Status(rev string) []RepoStatus {
	if rev == "" {
		rev = DefaultRevision
	}
	var out []RepoStatus
	for _, spec := range KnownRepos() {
		s := RepoStatus{Spec: spec}
		if commit, ok := c.Snapshot(spec.Repo, rev); ok {
			s.Commit, s.Dir = commit, c.SnapshotDir(spec.Repo, commit)
			s.Missing = spec.Check(s.Dir)
		} else {
			s.Missing = []string{"everything (not in the cache)"}
		}
		out = append(out, s)
	}
	return out
}

// VariantComplete reports, for each variant, whether every repository it needs is complete in
// the statuses.
func VariantComplete(statuses []RepoStatus) map[string]bool {
	ok := map[string]bool{}
	for _, s := range statuses {
		ok[s.Spec.Repo] = s.Complete()
	}
	out := map[string]bool{}
	for v, specs := range Variants {
		out[v] = true
		for _, s := range specs {
			if !ok[s.Repo] {
				out[v] = false
			}
		}
	}
	return out
}
