// Command mkmodels writes random-weight copies of FramePack's three Hugging Face repositories in
// the layout `huggingface-cli download --local-dir` leaves (what framepackd's --models and
// FramePack's from_pretrained both read):
//
//	ROOT/hunyuanvideo-community/HunyuanVideo/{text_encoder,text_encoder_2,tokenizer,tokenizer_2,vae}
//	ROOT/lllyasviel/flux_redux_bfl/{image_encoder,feature_extractor}
//	ROOT/lllyasviel/FramePackI2V_HY/
//
// Tensor names, shapes and dtypes: with -manifests DIR, the full-size models of
// scripts/gpubench/torch_bench.py --manifests-only (names and shapes from the reference modules'
// state_dict at the real sizes, ARCHITECTURE.md §8; config.json beside each manifest), each
// tensor's dtype taken from the fixture checkpoint's tensor of the same name (layer indices
// folded to 0: the fixtures have fewer layers); without it, the fixture checkpoints themselves
// (testdata/parity/models: the tiny models, re-drawn). With manifests, the SigLIP preprocessor's
// size follows the full-size image_size (384 px, the fixture's is 56). Names are written as the hub has them:
// CLIP's under text_model. and SigLIP's under vision_model. (transformers 4 saved the wrapper
// module; the fixtures and transformers 5's state_dict leave it out). Tokenizers and the SigLIP preprocessor
// config are copied from the fixtures. Checkpoints bigger than a model's shard size are split
// into NAME-0000i-of-0000n.safetensors with NAME.safetensors.index.json, as the hub has them
// (text_encoder in 5 GB shards: 4 files; the transformer in 10 GB shards: 3 files).
//
// Values are drawn by a multi-threaded generator straight into the files (pwrite of 16 MiB
// chunks, one SplitMix64 stream per chunk): 16-bit floats of magnitude 2^-10 to 2^-5 with a
// random sign, I64 buffers counting along their last dimension. A folder whose .mkmodels stamp
// matches the request is kept (re-runs on the GPU machine cost nothing).
//
//	mkmodels -fixtures testdata/parity/models [-manifests DIR] -out ROOT [-shard-mb N] [-threads N]
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// model is one checkpoint folder to write.
type model struct {
	key     string  // torch_bench.py's model name (the manifest folder)
	fixture string  // folder under -fixtures
	out     string  // folder under -out
	base    string  // weight file name without .safetensors
	shardGB float64 // shard size (0: one file)
	// prefix is the wrapper module the hub's checkpoint names carry and transformers 5 leaves
	// out (the fixtures, saved with transformers 5, have bare names): written on every name.
	prefix string
}

var models = []model{
	{"llama", "hunyuanvideo/text_encoder", "hunyuanvideo-community/HunyuanVideo/text_encoder", "model", 5, ""},
	{"clip", "hunyuanvideo/text_encoder_2", "hunyuanvideo-community/HunyuanVideo/text_encoder_2", "model", 0, "text_model."},
	{"vae", "hunyuanvideo/vae", "hunyuanvideo-community/HunyuanVideo/vae", "diffusion_pytorch_model", 0, ""},
	{"siglip", "flux_redux_bfl/image_encoder", "lllyasviel/flux_redux_bfl/image_encoder", "model", 0, "vision_model."},
	{"transformer", "framepack_i2v", "lllyasviel/FramePackI2V_HY", "diffusion_pytorch_model", 10, ""},
}

// copies are the fixture folders copied as they are.
var copies = [][2]string{
	{"hunyuanvideo/tokenizer", "hunyuanvideo-community/HunyuanVideo/tokenizer"},
	{"hunyuanvideo/tokenizer_2", "hunyuanvideo-community/HunyuanVideo/tokenizer_2"},
	{"flux_redux_bfl/feature_extractor", "lllyasviel/flux_redux_bfl/feature_extractor"},
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mkmodels:", err)
		os.Exit(1)
	}
}

func run() error {
	fixtures := flag.String("fixtures", "testdata/parity/models", "the tiny models (names, dtypes, tokenizers)")
	manifests := flag.String("manifests", "", "torch_bench.py --manifests-only output: full-size names, shapes and configs (empty: the fixtures' own)")
	out := flag.String("out", "", "root folder to write the repositories into")
	shardMB := flag.Float64("shard-mb", 0, "shard size in MB for the sharded checkpoints (0: the hub's, 5 GB and 10 GB)")
	threads := flag.Int("threads", runtime.NumCPU(), "generator threads")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()
	if *out == "" {
		return fmt.Errorf("-out is required")
	}
	start := time.Now()
	var total int64
	for _, m := range models {
		t0 := time.Now()
		tensors, cfg, err := specOf(m, *fixtures, *manifests)
		if err != nil {
			return err
		}
		shard := int64(m.shardGB * 1e9)
		if *shardMB > 0 && m.shardGB > 0 {
			shard = int64(*shardMB * 1e6)
		}
		dir := filepath.Join(*out, m.out)
		stamp := stampOf(tensors, cfg, shard, *seed)
		n, kept, err := writeModel(dir, m.base, tensors, cfg, shard, stamp, *seed, *threads)
		if err != nil {
			return fmt.Errorf("model %s: %w", m.key, err)
		}
		total += n
		if kept {
			fmt.Printf("mkmodels %-11s %7.2f GB kept (%s)\n", m.key, float64(n)/1e9, dir)
			continue
		}
		s := time.Since(t0).Seconds()
		fmt.Printf("mkmodels %-11s %7.2f GB in %6.1f s, %5.2f GB/s, %d tensors (%s)\n", m.key, float64(n)/1e9, s, float64(n)/1e9/s, len(tensors), dir)
	}
	for _, c := range copies {
		if err := copyDir(filepath.Join(*fixtures, c[0]), filepath.Join(*out, c[1])); err != nil {
			return err
		}
	}
	if *manifests != "" {
		if err := resizePreprocessor(filepath.Join(*out, copies[2][1]), filepath.Join(*manifests, "siglip")); err != nil {
			return err
		}
	}
	s := time.Since(start).Seconds()
	fmt.Printf("mkmodels total %.2f GB in %.1f s (%.2f GB/s) under %s\n", float64(total)/1e9, s, float64(total)/1e9/s, *out)
	return nil
}

// tensor is one tensor of a checkpoint to write.
type tensor struct {
	Name  string
	DType safetensors.DType
	Shape []int64
}

func (t tensor) bytes() int64 {
	n := int64(t.DType.Size())
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

var layerIndex = regexp.MustCompile(`\.\d+\.`)

// specOf returns the tensors and config.json of m: the fixture's, or the manifest's with the
// fixture's dtypes.
func specOf(m model, fixtures, manifests string) ([]tensor, []byte, error) {
	fixDir := filepath.Join(fixtures, m.fixture)
	ck, err := safetensors.OpenCheckpoint(fixDir)
	if err != nil {
		return nil, nil, fmt.Errorf("fixture %s: %w", m.key, err)
	}
	defer ck.Close()
	fix := map[string]safetensors.TensorInfo{} // by bare name
	counts := map[safetensors.DType]int{}
	for _, name := range ck.Names() {
		ti, _ := ck.Info(name)
		fix[strings.TrimPrefix(name, m.prefix)] = ti
		counts[ti.DType]++
	}
	if manifests == "" {
		cfg, err := os.ReadFile(filepath.Join(fixDir, "config.json"))
		if err != nil {
			return nil, nil, fmt.Errorf("fixture %s: %w", m.key, err)
		}
		var ts []tensor
		for name, ti := range fix {
			ts = append(ts, tensor{Name: m.prefix + name, DType: ti.DType, Shape: ti.Shape})
		}
		sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
		return ts, cfg, nil
	}
	// the fixture's most common dtype, for names it lacks even with layer 0
	var common safetensors.DType
	for d, n := range counts {
		if common == "" || n > counts[common] || (n == counts[common] && d < common) {
			common = d
		}
	}
	dir := filepath.Join(manifests, m.key)
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, nil, fmt.Errorf("manifest %s: %w", m.key, err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, nil, fmt.Errorf("manifest %s: %w", m.key, err)
	}
	var man struct {
		Tensors map[string]struct {
			Shape []int64 `json:"shape"`
			DType string  `json:"dtype"`
		} `json:"tensors"`
	}
	if err := json.Unmarshal(raw, &man); err != nil {
		return nil, nil, fmt.Errorf("manifest %s: %w", m.key, err)
	}
	var ts []tensor
	bare := map[string]bool{}
	for full, t := range man.Tensors {
		name := strings.TrimPrefix(full, m.prefix)
		bare[name] = true
		dt := common
		switch t.DType {
		case "int64":
			dt = safetensors.I64
		case "bool", "uint8", "int32":
			continue // buffers a checkpoint does not hold
		default:
			if ti, ok := fix[name]; ok {
				dt = ti.DType
			} else if ti, ok := fix[layerIndex.ReplaceAllString(name, ".0.")]; ok {
				dt = ti.DType
			}
		}
		ts = append(ts, tensor{Name: m.prefix + name, DType: dt, Shape: t.Shape})
	}
	var missing []string
	for name := range fix {
		if !bare[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, nil, fmt.Errorf("manifest %s lacks %d tensors of the fixture (another reference version?): %s", m.key, len(missing), strings.Join(missing[:min(5, len(missing))], ", "))
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts, cfg, nil
}

func stampOf(ts []tensor, cfg []byte, shard int64, seed uint64) string {
	h := fnv.New64a()
	for _, t := range ts {
		fmt.Fprintf(h, "%s %s %v\n", t.Name, t.DType, t.Shape)
	}
	h.Write(cfg)
	fmt.Fprintf(h, "shard %d seed %d", shard, seed)
	return fmt.Sprintf("%016x\n", h.Sum64())
}

// file is one safetensors file: its tensors in order and where its data starts.
type file struct {
	name    string
	tensors []tensor
	dataOff int64
}

// writeModel writes dir's config.json and checkpoint; it returns the checkpoint's size and
// whether a matching earlier copy was kept.
func writeModel(dir, base string, ts []tensor, cfg []byte, shard int64, stamp string, seed uint64, threads int) (int64, bool, error) {
	var size int64
	for _, t := range ts {
		size += t.bytes()
	}
	if old, err := os.ReadFile(filepath.Join(dir, ".mkmodels")); err == nil && string(old) == stamp {
		return size, true, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return 0, false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, false, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		return 0, false, err
	}
	// shards: tensors in name order, a new file when the next tensor would pass the size
	var groups [][]tensor
	var cur []tensor
	var curSize int64
	for _, t := range ts {
		if shard > 0 && len(cur) > 0 && curSize+t.bytes() > shard {
			groups = append(groups, cur)
			cur, curSize = nil, 0
		}
		cur = append(cur, t)
		curSize += t.bytes()
	}
	groups = append(groups, cur)
	files := make([]*file, len(groups))
	weightMap := map[string]string{}
	for i, g := range groups {
		name := base + ".safetensors"
		if shard > 0 {
			name = fmt.Sprintf("%s-%05d-of-%05d.safetensors", base, i+1, len(groups))
		}
		files[i] = &file{name: name, tensors: g}
		for _, t := range g {
			weightMap[t.Name] = name
		}
	}
	if shard > 0 {
		idx, err := json.MarshalIndent(map[string]any{"metadata": map[string]int64{"total_size": size}, "weight_map": weightMap}, "", "  ")
		if err != nil {
			return 0, false, err
		}
		if err := os.WriteFile(filepath.Join(dir, base+".safetensors.index.json"), idx, 0o644); err != nil {
			return 0, false, err
		}
	}
	if err := fill(dir, files, seed, threads); err != nil {
		return 0, false, err
	}
	return size, false, os.WriteFile(filepath.Join(dir, ".mkmodels"), []byte(stamp), 0o644)
}

// header is a safetensors header for f's tensors in order (safetensors.EncodeLayout: the data
// is drawn straight into the file afterwards).
func header(f *file) ([]byte, error) {
	infos := make([]safetensors.TensorInfo, len(f.tensors))
	for i, t := range f.tensors {
		infos[i] = safetensors.TensorInfo{Name: t.Name, DType: t.DType, Shape: t.Shape}
	}
	return safetensors.EncodeLayout(infos, safetensors.WriteOptions{Metadata: map[string]string{"format": "pt"}})
}

const chunkBytes = 16 << 20

// job is one chunk of one tensor to draw and write.
type job struct {
	f      *os.File
	t      tensor
	at     int64 // file offset of the chunk
	within int64 // the chunk's byte offset inside the tensor
	n      int64
}

// fill writes every file's header and draws its tensors' values on threads goroutines.
func fill(dir string, files []*file, seed uint64, threads int) error {
	jobs := make(chan job, 4*threads)
	errs := make(chan error, threads+1)
	var wg sync.WaitGroup
	for range max(threads, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, chunkBytes)
			var first error
			for j := range jobs {
				if first != nil {
					continue // drain
				}
				b := buf[:j.n]
				draw(b, j.t, j.within, seed^nameHash(j.t.Name)^uint64(j.within)*0x9e3779b97f4a7c15)
				if _, err := j.f.WriteAt(b, j.at); err != nil {
					first = fmt.Errorf("write %s: %w", j.f.Name(), err)
				}
			}
			if first != nil {
				errs <- first
			}
		}()
	}
	var opened []*os.File
	var prodErr error
	for _, f := range files {
		hdr, err := header(f)
		if err != nil {
			prodErr = err
			break
		}
		fh, err := os.Create(filepath.Join(dir, f.name))
		if err != nil {
			prodErr = err
			break
		}
		opened = append(opened, fh)
		if _, err := fh.Write(hdr); err != nil {
			prodErr = fmt.Errorf("write %s: %w", fh.Name(), err)
			break
		}
		off := int64(len(hdr))
		for _, t := range f.tensors {
			size := t.bytes()
			for w := int64(0); w < size; w += chunkBytes {
				jobs <- job{f: fh, t: t, at: off + w, within: w, n: min(chunkBytes, size-w)}
			}
			off += size
		}
		if err := fh.Truncate(off); err != nil { // zero-size tensors at the end still count
			prodErr = err
			break
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for _, fh := range opened {
		if err := fh.Close(); err != nil && prodErr == nil {
			prodErr = err
		}
	}
	if prodErr != nil {
		return prodErr
	}
	return <-errs // nil when the channel is empty
}

func nameHash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// draw fills b, the bytes of t from byte offset within, with random values of t's dtype.
func draw(b []byte, t tensor, within int64, seed uint64) {
	s := seed | 1
	next := func() uint64 { // SplitMix64
		s += 0x9e3779b97f4a7c15
		z := s
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		return z ^ (z >> 31)
	}
	switch t.DType {
	case safetensors.BF16, safetensors.F16, safetensors.F32:
		// exponents of 2^-10 … 2^-5 (six of eight draws spread evenly, two on the middle)
		exps := [8]uint16{117, 118, 119, 120, 121, 122, 119, 120}
		half := func(u uint16) uint16 {
			if t.DType == safetensors.F16 {
				return u&0x8000 | (exps[(u>>10)&7]-112)<<10 | u&0x3ff
			}
			return u&0x8000 | exps[(u>>7)&7]<<7 | u&0x7f
		}
		if t.DType == safetensors.F32 {
			for i := 0; i+4 <= len(b); i += 4 {
				binary.LittleEndian.PutUint32(b[i:], uint32(half(uint16(next())))<<16)
			}
			return
		}
		i := 0
		for ; i+8 <= len(b); i += 8 {
			r := next()
			binary.LittleEndian.PutUint16(b[i:], half(uint16(r)))
			binary.LittleEndian.PutUint16(b[i+2:], half(uint16(r>>16)))
			binary.LittleEndian.PutUint16(b[i+4:], half(uint16(r>>32)))
			binary.LittleEndian.PutUint16(b[i+6:], half(uint16(r>>48)))
		}
		for ; i+2 <= len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], half(uint16(next())))
		}
	case safetensors.I64: // index buffers (position ids): 0, 1, 2, … along the last dimension
		last := int64(1)
		if len(t.Shape) > 0 && t.Shape[len(t.Shape)-1] > 0 {
			last = t.Shape[len(t.Shape)-1]
		}
		for i := 0; i+8 <= len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], uint64(((within+int64(i))/8)%last))
		}
	default:
		for i := range b {
			b[i] = 0
		}
	}
}

// resizePreprocessor sets the SigLIP preprocessor's size in dir (the fixture's, copied: 56 px)
// to the image_size of the full-size config in cfgDir (384 px).
func resizePreprocessor(dir, cfgDir string) error {
	raw, err := os.ReadFile(filepath.Join(cfgDir, "config.json"))
	if err != nil {
		return fmt.Errorf("siglip config: %w", err)
	}
	var cfg struct {
		ImageSize int `json:"image_size"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil || cfg.ImageSize <= 0 {
		return fmt.Errorf("siglip config %s: no image_size (%v)", cfgDir, err)
	}
	path := filepath.Join(dir, "preprocessor_config.json")
	raw, err = os.ReadFile(path)
	if err != nil {
		return err
	}
	var pre map[string]any
	if err := json.Unmarshal(raw, &pre); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	pre["size"] = map[string]int{"height": cfg.ImageSize, "width": cfg.ImageSize}
	raw, err = json.MarshalIndent(pre, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}

// copyDir copies the files of src into dst (one level).
func copyDir(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		if err := copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}
