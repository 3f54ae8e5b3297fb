// Command gpubench is our side of the full-size speed table: every stage of a FramePack job at
// real shapes (544×704, window 9, 18 latent frames, 351 and 77 tokens, 384² pixels) on one
// backend, with random weights made in memory (no checkpoint files): the tensor names and shapes
// come from the manifests torch_bench.py writes from the reference modules, the values from a
// pool of random bf16 numbers. Weights are held in bf16 (16-bit storage, f32 accumulation),
// activations in f32. Writes ours.json next to the manifests; table.py joins both sides.
//
//	gpubench -dir DIR [-backend cuda] [-stages transformer,vae_decode,...] [-profile]
//
// -profile runs each stage once warm and once under runtime.Profile (a stream sync after every
// op) instead of the timed runs, prints where the device time goes per op and writes
// profile-<stage>.json; its times are perturbed by the syncs, so it never feeds the speed table.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/framepackd/framepackd/internal/envconfig"
	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/workers/clipvision/siglip"
	"github.com/framepackd/framepackd/workers/textenc/clip"
	"github.com/framepackd/framepackd/workers/textenc/llama"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
	"github.com/framepackd/framepackd/workers/transformer/dit"
	"github.com/framepackd/framepackd/workers/vae/causalvae"
)

// FramePack's section at the 640 bucket, as torch_bench.py.
const (
	latH, latW   = 68, 88
	window       = 9
	decodeFrames = 18
	llamaTokens  = 351
	textTokens   = 128
	poolBytes    = 64 << 20
)

// tiledCapGiB is the runtime's memory cap in the vae_decode_tiled stage.
var tiledCapGiB float64

var allStages = []string{"transformer", "vae_decode", "vae_decode_tiled", "vae_decode_tiled256", "vae_encode", "llama", "clip", "siglip"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gpubench:", err)
		os.Exit(1)
	}
}

type result struct {
	Seconds     float64   `json:"seconds,omitempty"`
	Runs        []float64 `json:"runs,omitempty"`
	PeakBytes   uint64    `json:"peak_bytes,omitempty"`
	CapBytes    uint64    `json:"cap_bytes,omitempty"`
	DType       string    `json:"dtype,omitempty"`
	LoadSeconds float64   `json:"build_seconds,omitempty"`
	Note        string    `json:"note,omitempty"`
	Error       string    `json:"error,omitempty"`
	// Tiling is the VAE tiling run and its estimated peak above the weights.
	Tiling            string `json:"tiling,omitempty"`
	PeakEstimateBytes int64  `json:"peak_estimate_bytes,omitempty"`
	// Conv is the conv chain's statistics of the stage (its own runtime).
	Conv *convReport `json:"conv,omitempty"`
}

// convReport is the conv chain's statistics of one stage: which tier served which shape and
// how long each shape's first (synchronised) run took: for vendor_tuned that is cuDNN's FindEx
// or MIOpen's Find.
type convReport struct {
	Convs  int64            `json:"convs"`
	Served map[string]int64 `json:"served_by_tier"`
	// FirstSeconds sums the shapes' first runs (Find included); the warm-up run pays it.
	FirstSeconds float64     `json:"first_run_seconds"`
	Shapes       []convShape `json:"shapes"`
}

type convShape struct {
	Key     string  `json:"key"`
	Tier    string  `json:"tier"`
	Calls   int64   `json:"calls"`
	FirstMs float64 `json:"first_ms"`
	TimeMs  float64 `json:"time_ms"`
}

func convStats(cs runtime.ConvStats) *convReport {
	if cs.Convs == 0 {
		return nil
	}
	r := &convReport{Convs: cs.Convs, Served: map[string]int64{}}
	for t := runtime.Tier(0); t < runtime.NumTiers; t++ {
		if n := cs.Tiers[t].Successes; n > 0 {
			r.Served[t.String()] = n
		}
	}
	for k, sh := range cs.Shapes {
		r.FirstSeconds += sh.First.Seconds()
		r.Shapes = append(r.Shapes, convShape{Key: k, Tier: sh.Tier.String(), Calls: sh.Calls,
			FirstMs: float64(sh.First.Microseconds()) / 1e3, TimeMs: float64(sh.Time.Microseconds()) / 1e3})
	}
	sort.Slice(r.Shapes, func(i, j int) bool { return r.Shapes[i].FirstMs > r.Shapes[j].FirstMs })
	return r
}

type report struct {
	Backend string             `json:"backend"`
	Device  string             `json:"device"`
	Stages  map[string]*result `json:"stages"`
}

func run() error {
	dir := flag.String("dir", "", "folder of torch_bench.py's configs and manifests")
	backend := flag.String("backend", "cuda", "runtime backend")
	stages := flag.String("stages", strings.Join(allStages, ","), "stages to run (also "+strings.Join(cacheStages, ", ")+": one whole section per step cache)")
	flag.Float64Var(&tiledCapGiB, "vae-tiled-cap-gib", 8, "memory cap of the vae_decode_tiled stage, whose tiling the VAE chooses from it")
	prof := flag.Bool("profile", false, "per-op device time of one run of each stage instead of the timed runs")
	flag.Parse()
	if *dir == "" {
		return fmt.Errorf("-dir is required")
	}
	rep := report{Backend: *backend, Stages: map[string]*result{}}
	pool := newPool(poolBytes)
	for _, st := range strings.Split(*stages, ",") {
		if st == "" {
			continue
		}
		act, err := stageActivation(st)
		if err != nil {
			return err
		}
		res := &result{DType: act.String() + " weights and activations, f32 accumulation"}
		start := time.Now()
		var p *profile
		if *prof {
			p = &profile{Stage: st}
		}
		if err := runStage(*dir, *backend, st, pool, res, &rep, p); err != nil {
			res.Error = err.Error()
		}
		if p != nil {
			if err := p.write(*dir, os.Stdout); err != nil {
				return err
			}
			if res.Error != "" {
				fmt.Printf("profile %s: %s\n", st, res.Error)
			}
			continue
		}
		rep.Stages[st] = res
		raw, _ := json.Marshal(res)
		fmt.Printf("ours %s (%v): %s\n", st, time.Since(start).Round(time.Millisecond), raw)
		out, _ := json.MarshalIndent(rep, "", " ")
		if err := os.WriteFile(filepath.Join(*dir, "ours.json"), out, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// timed runs fn warm times, then reps times, and records the median.
func timed(rt *runtime.Runtime, res *result, warm, reps int, fn func() error) error {
	for range warm {
		if err := fn(); err != nil {
			return err
		}
	}
	if err := rt.Synchronize(); err != nil {
		return err
	}
	for range reps {
		t0 := time.Now()
		if err := fn(); err != nil {
			return err
		}
		if err := rt.Synchronize(); err != nil {
			return err
		}
		res.Runs = append(res.Runs, time.Since(t0).Seconds())
	}
	s := append([]float64(nil), res.Runs...)
	sort.Float64s(s)
	res.Seconds = s[len(s)/2]
	return nil
}

// stageActivation is the activation (and weight) dtype FramePack runs a stage's model in (each
// model package's FramePackDType); the test knob envconfig.ActivationDType overrides
// it for every stage, as it does in the workers.
func stageActivation(stage string) (runtime.DType, error) {
	if v := envconfig.ActivationDType.Get(); v != "" {
		return runtime.ParseActivationDType(v)
	}
	switch {
	case strings.HasPrefix(stage, "transformer") || isCacheStage(stage):
		return dit.FramePackDType, nil
	case strings.HasPrefix(stage, "vae"):
		return causalvae.FramePackDType, nil
	case stage == "llama":
		return llama.FramePackDType, nil
	case stage == "clip":
		return clip.FramePackDType, nil
	case stage == "siglip":
		return siglip.FramePackDType, nil
	}
	return 0, fmt.Errorf("unknown stage %q", stage)
}

func runStage(dir, backend, stage string, pool *pool, res *result, rep *report, prof *profile) error {
	act, err := stageActivation(stage)
	if err != nil {
		return err
	}
	opts := runtime.Options{Backend: backend}
	if stage == "vae_decode_tiled" {
		opts.MemoryCap = int64(tiledCapGiB * (1 << 30))
	}
	rt, err := runtime.New(opts)
	if err != nil {
		return err
	}
	timed := timed
	if prof != nil {
		timed = prof.run
	}
	defer rt.Close()
	rep.Device = rt.Backend().DeviceName
	ctx := context.Background()
	t0 := time.Now()
	defer func() {
		m := rt.Memory()
		res.PeakBytes, res.CapBytes = m.Peak, m.Cap
		res.Conv = convStats(rt.ConvStats())
	}()
	switch stage {
	case "transformer", "section_nocache", "section_teacache", "section_magcache":
		src, err := loadManifest(dir, "transformer", pool)
		if err != nil {
			return err
		}
		cfg, err := dit.LoadConfig(filepath.Join(dir, "transformer"))
		if err != nil {
			return err
		}
		m, err := dit.New(rt, cfg, src, dit.LoadOptions{WeightDType: act, ActivationDType: act})
		if err != nil {
			return err
		}
		defer m.Close()
		if isCacheStage(stage) {
			res.LoadSeconds = time.Since(t0).Seconds()
			return runCacheStage(ctx, rt, m, stage, res, timed)
		}
		c, shape, x := ditConditioning(cfg)
		sec, err := m.Prepare(c, shape)
		if err != nil {
			return err
		}
		defer sec.Close()
		res.LoadSeconds = time.Since(t0).Seconds()
		img, enc := sec.Tokens()
		res.Note = fmt.Sprintf("forward only (the section's conditioning is embedded once by Prepare); %d image + %d text/image tokens", img, enc)
		return timed(rt, res, 1, 2, func() error {
			_, err := m.Forward(ctx, sec, x, 875, 10000, dit.ForwardOptions{})
			return err
		})
	case "vae_decode", "vae_decode_tiled", "vae_decode_tiled256", "vae_encode":
		src, err := loadManifest(dir, "vae", pool)
		if err != nil {
			return err
		}
		cfg, _, err := causalvae.LoadConfig(filepath.Join(dir, "vae"))
		if err != nil {
			return err
		}
		m, err := causalvae.LoadFrom(rt, cfg, src, causalvae.Options{DType: act, WeightDType: act})
		if err != nil {
			return err
		}
		defer m.Close()
		res.LoadSeconds = time.Since(t0).Seconds()
		z := randVolume([5]int{1, cfg.LatentChannels, decodeFrames, latH, latW}, 2)
		x := randVolume([5]int{1, 3, 1, latH * 8, latW * 8}, 1)
		// decode: diffusers' default (framewise, as PyTorch's side); decode_tiled: the tiling
		// the model chooses from what the cap leaves beside its weights; decode_tiled256:
		// enable_tiling's 256/192 px tiles, as PyTorch's tiled stage; encode: the default.
		ch, err := m.Estimate(z.Shape, causalvae.DefaultTiling(), false, m.Footprint())
		switch {
		case err != nil:
			return err
		case stage == "vae_decode_tiled256":
			t := causalvae.DefaultTiling()
			t.Spatial = true
			if ch, err = m.Estimate(z.Shape, t, false, m.Footprint()); err != nil {
				return err
			}
		case stage == "vae_decode_tiled":
			var budget int64
			if ch, budget, err = m.AutoTiling(z.Shape, false); err != nil {
				return err
			}
			res.Note = fmt.Sprintf("tiling chosen at a %.3g GiB cap (%.2f GiB left beside the weights)", tiledCapGiB, float64(budget)/(1<<30))
		case stage == "vae_encode":
			if ch, err = m.Estimate(x.Shape, causalvae.DefaultTiling(), true, m.Footprint()); err != nil {
				return err
			}
		}
		res.Tiling, res.PeakEstimateBytes = ch.String(), ch.PeakBytes
		opts := causalvae.RunOptions{Tiling: ch.Tiling}
		if stage == "vae_encode" {
			return timed(rt, res, 1, 3, func() error {
				_, _, err := m.Encode(ctx, x, opts)
				return err
			})
		}
		return timed(rt, res, 1, 1, func() error {
			_, err := m.Decode(ctx, z, opts)
			return err
		})
	case "llama":
		src, err := loadManifest(dir, "llama", pool)
		if err != nil {
			return err
		}
		cfg, err := llama.LoadConfig(filepath.Join(dir, "llama"))
		if err != nil {
			return err
		}
		m, err := llama.New(rt, cfg, src, llama.Options{HiddenStateIndex: -3, Options: nn.Options{DType: act, WeightDType: act}})
		if err != nil {
			return err
		}
		defer m.Close()
		res.LoadSeconds = time.Since(t0).Seconds()
		r := rand.New(rand.NewPCG(3, 4))
		ids := make([]int32, llamaTokens)
		mask := make([]bool, llamaTokens)
		for i := range ids {
			ids[i] = int32(r.IntN(min(128000, cfg.VocabSize)))
			mask[i] = true
		}
		return timed(rt, res, 1, 3, func() error {
			h, err := m.HiddenState(ids, mask)
			h.Free()
			return err
		})
	case "clip":
		src, err := loadManifest(dir, "clip", pool)
		if err != nil {
			return err
		}
		cfg, err := clip.LoadConfig(filepath.Join(dir, "clip"))
		if err != nil {
			return err
		}
		m, err := clip.New(rt, cfg, src, clip.Options{DType: act, WeightDType: act})
		if err != nil {
			return err
		}
		defer m.Close()
		res.LoadSeconds = time.Since(t0).Seconds()
		r := rand.New(rand.NewPCG(5, 6))
		ids := make([]int32, 77)
		for i := range ids {
			ids[i] = int32(r.IntN(min(49407, cfg.VocabSize-1)))
		}
		return timed(rt, res, 1, 5, func() error {
			p, err := m.Pooled(ids)
			p.Free()
			return err
		})
	case "siglip":
		src, err := loadManifest(dir, "siglip", pool)
		if err != nil {
			return err
		}
		cfg, err := siglip.LoadConfig(filepath.Join(dir, "siglip"))
		if err != nil {
			return err
		}
		m, err := siglip.LoadFrom(rt, cfg, src, siglip.LoadOptions{DType: act, WeightDType: act})
		if err != nil {
			return err
		}
		defer m.Free()
		res.LoadSeconds = time.Since(t0).Seconds()
		px := randVolume([5]int{1, 3, 384, 384, 1}, 7)
		pixels, err := rt.FromFloat32(px.Data, 1, 3, 384, 384)
		if err != nil {
			return err
		}
		defer pixels.Free()
		return timed(rt, res, 1, 5, func() error {
			y, err := m.Forward(pixels, nil)
			y.Free()
			return err
		})
	}
	return fmt.Errorf("unknown stage %q", stage)
}

func randVolume(shape [5]int, seed uint64) causalvae.Volume {
	v := causalvae.NewVolume(shape)
	r := rand.New(rand.NewPCG(seed, 9))
	for i := range v.Data {
		v.Data[i] = float32(r.NormFloat64())
	}
	return v
}

// conditioning is a FramePack section's conditioning at 544×704: clean latents 1x (2 frames),
// 2x (2), 4x (16), 729 SigLIP states, textTokens real text tokens of 512.
func ditConditioning(cfg dit.Config) (conditioning.Conditioning, [5]int, []float32) {
	r := rand.New(rand.NewPCG(11, 12))
	randn := func(shape ...int) conditioning.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return conditioning.Tensor{Shape: shape, Data: v}
	}
	idx := func(from, n int) conditioning.IntTensor {
		v := make([]int64, n)
		for i := range v {
			v[i] = int64(from + i)
		}
		return conditioning.IntTensor{Shape: []int{1, n}, Data: v}
	}
	mask := make([]int64, 512)
	for i := range textTokens {
		mask[i] = 1
	}
	c := conditioning.Conditioning{
		EncoderHiddenStates:  randn(1, 512, cfg.TextEmbedDim),
		EncoderAttentionMask: conditioning.IntTensor{Shape: []int{1, 512}, Data: mask},
		PooledProjections:    randn(1, cfg.PooledProjectionDim),
		LatentIndices:        idx(1, window),
		ImageEmbeddings:      randn(1, 729, cfg.ImageProjDim),
		CleanLatents:         randn(1, 16, 2, latH, latW),
		CleanLatentIndices:   conditioning.IntTensor{Shape: []int{1, 2}, Data: []int64{0, window + 1}},
		CleanLatents2x:       randn(1, 16, 2, latH, latW),
		CleanLatent2xIndices: idx(window+2, 2),
		CleanLatents4x:       randn(1, 16, 16, latH, latW),
		CleanLatent4xIndices: idx(window+4, 16),
	}
	shape := [5]int{1, cfg.InChannels, window, latH, latW}
	return c, shape, randn(shape[:]...).Data
}

// ---- random weights from a manifest ---------------------------------------------------------

// pool is a buffer of random bf16 values N(0, 0.02); tensors are served as slices of it (or
// repeats of it, for tensors larger than the pool).
type pool struct{ b []byte }

func newPool(n int) *pool {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := 0; i+1 < n; i += 2 {
		f := float32(r.NormFloat64() * 0.02)
		binary.LittleEndian.PutUint16(b[i:], uint16(math.Float32bits(f)>>16))
	}
	return &pool{b: b}
}

type manifestSource struct {
	infos map[string]safetensors.TensorInfo
	names []string
	pool  *pool
}

func loadManifest(dir, model string, p *pool) (*manifestSource, error) {
	raw, err := os.ReadFile(filepath.Join(dir, model, "manifest.json"))
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", model, err)
	}
	var m struct {
		Tensors map[string]struct {
			Shape []int64 `json:"shape"`
			DType string  `json:"dtype"`
		} `json:"tensors"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", model, err)
	}
	s := &manifestSource{infos: map[string]safetensors.TensorInfo{}, pool: p}
	for name, t := range m.Tensors {
		dt := safetensors.BF16
		switch t.DType {
		case "int64", "int32":
			dt = safetensors.I64
		case "bool", "uint8":
			continue
		}
		s.infos[name] = safetensors.TensorInfo{Name: name, DType: dt, Shape: t.Shape}
		s.names = append(s.names, name)
	}
	sort.Strings(s.names)
	return s, nil
}

func (s *manifestSource) Names() []string { return s.names }

func (s *manifestSource) Info(name string) (safetensors.TensorInfo, bool) {
	ti, ok := s.infos[name]
	if ok {
		ti.End = ti.NumElements() * int64(dtypeSize(ti.DType))
	}
	return ti, ok
}

func dtypeSize(d safetensors.DType) int {
	if d == safetensors.I64 {
		return 8
	}
	return 2
}

func (s *manifestSource) Bytes(name string) ([]byte, error) {
	ti, ok := s.infos[name]
	if !ok {
		return nil, fmt.Errorf("random source: no tensor %q", name)
	}
	n := int(ti.NumElements()) * dtypeSize(ti.DType)
	if ti.DType == safetensors.I64 { // index buffers (position ids): 0, 1, 2, … along the last dim
		out := make([]byte, n)
		last := int64(1)
		if len(ti.Shape) > 0 {
			last = ti.Shape[len(ti.Shape)-1]
		}
		for i := 0; i < n/8; i++ {
			binary.LittleEndian.PutUint64(out[i*8:], uint64(int64(i)%last))
		}
		return out, nil
	}
	pb := s.pool.b
	if n <= len(pb) {
		h := fnv.New64a()
		h.Write([]byte(name))
		off := int(h.Sum64()%uint64(len(pb)-n+1)) &^ 1
		return pb[off : off+n], nil
	}
	out := make([]byte, n)
	for i := 0; i < n; i += len(pb) {
		copy(out[i:], pb)
	}
	return out, nil
}
