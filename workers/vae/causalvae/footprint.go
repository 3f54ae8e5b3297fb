package causalvae

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// FootprintOptions describe how a tile runs, for the memory estimate: whose scratch its ops take
// and the dtypes of its activations and conv weights.
type FootprintOptions struct {
	// Backend is the backend whose scratch the convs and attention take: "cpu", "cuda" or
	// "hip" (runtime.ScratchPolicy; anything else, "auto" included, the cpu's).
	Backend     string
	DType       runtime.DType // the activations' (and norms', biases') dtype; 0 means F32
	WeightDType runtime.DType // the conv weights' dtype; 0 means DType
}

// meter measures the memory a tile's forward holds: the model's real forward run on a
// shape-only runtime (no compute) whose allocator counts every tensor, and every conv's and
// attention's scratch as the backend's own ops would take it (native/src/fpk_scratch.h).
type meter struct {
	rt    *runtime.Runtime
	m     *Model
	base  int64              // bytes the weights hold
	peaks map[meterKey]int64 // measured tiles
}

type meterKey struct {
	shape  [5]int
	encode bool
}

func newMeter(c Config, o FootprintOptions) (*meter, error) {
	rt, err := runtime.New(runtime.Options{Backend: o.Backend, ShapeOnly: true})
	if err != nil {
		return nil, fmt.Errorf("vae footprint: %w", err)
	}
	dt := o.DType
	if dt == 0 {
		dt = runtime.F32
	}
	l := nn.NewEmptyLoader(rt, nn.Options{DType: dt, WeightDType: o.WeightDType})
	m := &Model{Config: c, rt: rt, act: dt}
	m.bind(l)
	ws, _, err := l.Finish()
	if err == nil {
		m.Weights = ws
		for _, r := range m.resnets() {
			var made []*runtime.Tensor
			made, err = r.split(rt)
			m.halves = append(m.halves, made...)
			if err != nil {
				break
			}
		}
	}
	if err != nil {
		m.Close()
		rt.Close()
		return nil, fmt.Errorf("vae footprint: %w", err)
	}
	return &meter{rt: rt, m: m, base: int64(rt.Memory().Allocated), peaks: map[meterKey]int64{}}, nil
}

// peak is the most bytes beside the weights the forward of one tile of shape sh holds:
// its input uploaded, the activations as the model code allocates and frees them, each op's
// scratch, and the output until it is downloaded.
func (mt *meter) peak(ctx context.Context, sh [5]int, encode bool) (int64, error) {
	k := meterKey{sh, encode}
	if n, ok := mt.peaks[k]; ok {
		return n, nil
	}
	if err := mt.rt.ResetPeak(); err != nil {
		return 0, err
	}
	x, err := mt.rt.NewTensor(mt.m.act, sh[:]...)
	if err != nil {
		return 0, err
	}
	var out *runtime.Tensor
	if encode {
		out, err = mt.m.encodeForward(ctx, x)
	} else {
		out, err = mt.m.decodeForward(ctx, x)
	}
	out.Free()
	if err != nil {
		return 0, fmt.Errorf("vae footprint of %v: %w", sh, err)
	}
	n := int64(mt.rt.Memory().Peak) - mt.base
	mt.peaks[k] = n
	return n, nil
}

func (mt *meter) close() {
	mt.m.Close()
	mt.rt.Close()
}

// planPeak is the most bytes any tile of p holds (one sample at a time), measured by mt.
func (c Config) planPeak(mt *meter, in [5]int, p plan, encode bool) (int64, error) {
	axis := func(a *axisPlan, n int) []int {
		if a == nil {
			return []int{n}
		}
		seen := map[int]bool{}
		var out []int
		for _, t := range a.tiles {
			if l := t.in1 - t.in0; l > 0 && !seen[l] {
				seen[l] = true
				out = append(out, l)
			}
		}
		return out
	}
	var peak int64
	for _, t := range axis(p.temporal, in[2]) {
		for _, h := range axis(p.h, in[3]) {
			for _, w := range axis(p.w, in[4]) {
				n, err := mt.peak(context.Background(), [5]int{1, in[1], t, h, w}, encode)
				if err != nil {
					return 0, err
				}
				peak = max(peak, n)
			}
		}
	}
	return peak, nil
}

// planWork is the work of p in output voxels computed (decode) or input voxels read
// (encode), summed over its tiles: what overlapping tiles cost in time.
func (c Config) planWork(in [5]int, p plan, encode bool) int64 {
	// the input length of each tile run (a temporal chunk whose only frame is dropped is not run)
	lens := func(a *axisPlan, n int, temporal bool) []int {
		if a == nil {
			return []int{n}
		}
		out := make([]int, 0, len(a.tiles))
		for _, t := range a.tiles {
			if t.n > 0 || !temporal {
				out = append(out, t.in1-t.in0)
			}
		}
		return out
	}
	size := func(axis, n int) int64 {
		if encode {
			return int64(n)
		}
		return int64(c.DecodedSize(axis, n))
	}
	var work int64
	for _, t := range lens(p.temporal, in[2], true) {
		for _, h := range lens(p.h, in[3], false) {
			for _, w := range lens(p.w, in[4], false) {
				work += size(0, t) * size(1, h) * size(2, w)
			}
		}
	}
	return work * int64(in[0])
}

// TilingChoice is a tiling with its estimated peak and work.
type TilingChoice struct {
	Tiling    Tiling
	PeakBytes int64 // bytes one tile holds at most (activations and scratch), measured
	Work      int64 // voxels computed over all tiles (relative time)
	Runs      int   // model runs per sample
	// TilePx is the spatial tile's smaller side in pixels (a strip's width or height); 0 when
	// not spatially tiled.
	TilePx int
}

// String describes the tiling for logs and errors: "framewise", "framewise+spatial
// 128/96px" (square tiles) or "framewise+spatial 544x512/544x384px" (strips: height x width,
// tile/stride), and the runs per sample.
func (c TilingChoice) String() string {
	t := c.Tiling
	s := "framewise"
	if !t.FramewiseDecoding && !t.FramewiseEncoding {
		s = "whole"
	}
	switch {
	case c.TilePx == 0:
	case t.TileSampleMinHeight == t.TileSampleMinWidth && t.TileSampleStrideHeight == t.TileSampleStrideWidth:
		s += fmt.Sprintf("+spatial %d/%dpx", t.TileSampleMinHeight, t.TileSampleStrideHeight)
	default:
		s += fmt.Sprintf("+spatial %dx%d/%dx%dpx", t.TileSampleMinHeight, t.TileSampleMinWidth,
			t.TileSampleStrideHeight, t.TileSampleStrideWidth)
	}
	return fmt.Sprintf("%s, %d runs", s, c.Runs)
}

// ErrMemoryBudget is wrapped by ChooseTiling's error when not even the smallest tile fits the
// budget: a retry at the same cap cannot help.
var ErrMemoryBudget = errors.New("vae memory budget too small")

// autoTilePx are the spatial tile sizes an automatic tiling considers, in pixels, with a
// stride of 3/4 of the tile as diffusers' 256/192 default and the watchdog's ladder. Each is a
// multiple of 32 px, so the stride is whole latents (diffusers mixes pixel and latent strides:
// with 16/12 px tiles the 12 px crops of 8 px steps would stretch the picture).
var autoTilePx = []int{512, 384, 256, 192, 128, 96, 64, 32}

// Estimate returns the footprint and work of running an input of shape in with tiling t.
func (m *Model) Estimate(in [5]int, t Tiling, encode bool, o FootprintOptions) (TilingChoice, error) {
	mt, err := newMeter(m.Config, o)
	if err != nil {
		return TilingChoice{}, err
	}
	defer mt.close()
	return m.estimate(mt, in, t, encode)
}

func (m *Model) estimate(mt *meter, in [5]int, t Tiling, encode bool) (TilingChoice, error) {
	p, err := m.makePlan(in, t, encode)
	if err != nil {
		return TilingChoice{}, err
	}
	ch := TilingChoice{Tiling: t, Work: m.Config.planWork(in, p, encode), Runs: p.runs}
	if ch.PeakBytes, err = m.Config.planPeak(mt, in, p, encode); err != nil {
		return TilingChoice{}, err
	}
	if p.h != nil {
		ch.TilePx = min(t.TileSampleMinHeight, t.TileSampleMinWidth)
	}
	return ch, nil
}

// Candidates lists the tilings an automatic choice considers for an input of shape in:
// diffusers' framewise chunking (always on, as FramePack runs it) alone, then with spatial
// tiles of autoTilePx: square tiles, and strips, tiles of the whole height (or width) and px
// along the other side, so that a picture a little too big for the budget is cut in two or
// three strips instead of into squares that overlap in both directions (544×704 under an
// 8 GiB cap: two 512 px wide strips compute 1.18× the untiled decode's voxels, 512 px squares
// 1.46×). Both are diffusers' own tiled decode with other tile sizes (tile_sample_min_height and
// _width, their strides; a stride of the whole side makes one tile along it, with no blend).
// The list runs from the largest estimated peak down, keeping only tilings that tile this
// input and need less memory than the one before.
func (m *Model) Candidates(in [5]int, encode bool, o FootprintOptions) ([]TilingChoice, error) {
	mt, err := newMeter(m.Config, o)
	if err != nil {
		return nil, err
	}
	defer mt.close()
	base := DefaultTiling()
	first, err := m.estimate(mt, in, base, encode)
	if err != nil {
		return nil, err
	}
	// the input's height and width in pixels
	hPx, wPx := in[3], in[4]
	if !encode {
		hPx, wPx = in[3]*m.Config.SpatialCompressionRatio, in[4]*m.Config.SpatialCompressionRatio
	}
	var tilings []Tiling
	for _, px := range autoTilePx {
		t := base
		t.Spatial = true
		t.TileSampleMinHeight, t.TileSampleMinWidth = px, px
		t.TileSampleStrideHeight, t.TileSampleStrideWidth = px*3/4, px*3/4
		tilings = append(tilings, t)
		if px < wPx && hPx%32 == 0 { // strips px wide, the whole height
			s := t
			s.TileSampleMinHeight, s.TileSampleStrideHeight = hPx, hPx
			tilings = append(tilings, s)
		}
		if px < hPx && wPx%32 == 0 { // strips px high, the whole width
			s := t
			s.TileSampleMinWidth, s.TileSampleStrideWidth = wPx, wPx
			tilings = append(tilings, s)
		}
	}
	var cands []TilingChoice
	for _, t := range tilings {
		if t.Validate(m.Config) != nil {
			continue
		}
		ch, err := m.estimate(mt, in, t, encode)
		if err != nil {
			return nil, err
		}
		if ch.TilePx == 0 {
			continue // the picture fits one tile
		}
		cands = append(cands, ch)
	}
	slices.SortStableFunc(cands, func(a, b TilingChoice) int { return cmp.Compare(b.PeakBytes, a.PeakBytes) })
	out := []TilingChoice{first}
	for _, ch := range cands {
		if ch.PeakBytes < out[len(out)-1].PeakBytes {
			out = append(out, ch)
		}
	}
	return out, nil
}

// ChooseTiling picks the tiling with the least work (then the fewest runs) whose estimated
// peak fits budget bytes (what the cap leaves beside the weights). With no fitting tiling it fails (errors.Is
// ErrMemoryBudget) naming the smallest tile's need, before any work starts.
func (m *Model) ChooseTiling(in [5]int, encode bool, budget int64, o FootprintOptions) (TilingChoice, error) {
	cands, err := m.Candidates(in, encode, o)
	if err != nil {
		return TilingChoice{}, err
	}
	best := -1
	for i, c := range cands {
		if c.PeakBytes > budget {
			continue
		}
		if b := best; b < 0 || c.Work < cands[b].Work || (c.Work == cands[b].Work && c.Runs < cands[b].Runs) {
			best = i
		}
	}
	if best >= 0 {
		return cands[best], nil
	}
	small := cands[len(cands)-1]
	return TilingChoice{}, fmt.Errorf("%w: the smallest tiling (%s) needs about %.1f MiB for one tile and the memory cap leaves %.1f MiB beside the weights; raise the cap (less gpu_memory_preservation_gb) or use a smaller input",
		ErrMemoryBudget, small, mib(small.PeakBytes), mib(max(budget, 0)))
}

// Budget returns the bytes a stage's activations may use now: what the runtime's memory cap
// leaves beside what it holds (the weights); with no cap, on a GPU, the device's free memory
// plus the allocator's cached blocks, and on the cpu no limit (capped false).
func (m *Model) Budget() (bytes int64, capped bool, err error) {
	mem := m.rt.Memory()
	if mem.Cap > 0 {
		return int64(mem.Cap) - int64(mem.Allocated), true, nil
	}
	if m.rt.Backend().IsHost {
		return math.MaxInt64, false, nil
	}
	free, _, err := m.rt.DeviceMemory()
	if err != nil {
		return 0, false, fmt.Errorf("vae memory budget: %w", err)
	}
	return int64(min(free+mem.Cached, math.MaxInt64)), true, nil
}

// AutoTiling chooses the tiling of an encode (encode true) or decode of an input of shape in
// from the memory the runtime's cap leaves now (Budget): ChooseTiling with m's Footprint. It also returns the budget (math.MaxInt64 with none).
func (m *Model) AutoTiling(in [5]int, encode bool) (TilingChoice, int64, error) {
	budget, _, err := m.Budget()
	if err != nil {
		return TilingChoice{}, 0, err
	}
	ch, err := m.ChooseTiling(in, encode, budget, m.Footprint())
	return ch, budget, err
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
