package causalvae

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
)

// Scratch says how many bytes of scratch a backend's ops take beside their outputs (im2col
// bands, converted weights, algorithm workspace, attention scores). The footprint estimate
// adds it, transiently, to the tensors a tile holds.
type Scratch struct {
	// Conv is the scratch of one conv3d: kernel k (kT, kH, kW), input shape in [B, Cin, T, H,
	// W] (as the conv reads it, before its own padding: upsampled for an upsampler's conv),
	// output shape out [B, Cout, T', H', W'], activation element size elem, weight element size
	// welem.
	Conv func(k [3]int, in, out [5]int, elem, welem int) int64
	// Attention is the scratch of one attention call of lq queries and lk keys of width d.
	Attention func(lq, lk, d, elem int) int64
	// ReadsInPlace reports whether a conv of elem-byte activations and welem-byte weights
	// reads its padded (and upsampled) input in place (runtime.ConvInput); when not, the
	// native core makes that tensor for the call. Nil means never.
	ReadsInPlace func(elem, welem int) bool
}

// CPUScratch is the cpu backend's scratch (native/cpu): one im2col band of at most 32 MiB
// per conv plus a widened (f32) copy of a 16-bit weight, and chunks of 4 MiB-of-floats
// of scores per attention call.
func CPUScratch() Scratch {
	const colBudget = 32 << 20
	const scoreBudget = 4 << 20
	return Scratch{
		Conv: func(k [3]int, in, out [5]int, _, welem int) int64 {
			var n int64
			K := int64(in[1]) * int64(k[0]*k[1]*k[2])
			if k != unit {
				wo := int64(out[4])
				rows := max(min(int64(colBudget)/(K*wo*4), int64(out[3])), 1)
				n += charged(K * rows * wo * 4)
			}
			if welem != 4 {
				n += charged(int64(out[1]) * K * 4)
			}
			return n
		},
		Attention: func(lq, lk, _, _ int) int64 {
			chunk := max(min(int64(scoreBudget)/int64(lk), int64(lq)), 1)
			return charged(chunk * int64(lk) * 4)
		},
	}
}

// GPUScratch is the cuda and hip backends' scratch (native/gpu): a weight of another dtype
// than the activations converted to theirs, plus the workspace the vendor's algorithm search
// offers a conv (native/gpu/fpk_gpu_vendor.cu find_workspace_want: twice the bytes of its input
// and output, at least 16 MiB, at most FRAMEPACK_CUDNN_WORKSPACE_MB, default 8 GiB), and the
// chunked attention tier's scores (up to 1 GiB).
//
// The search halves its workspace down to what the cap leaves, so a tiling chosen without it
// runs, but slowly: on an H100 an 8 GiB cap chose 512 px tiles that left cuDNN too little room
// for its matrix-unit kernels (16.1 s, against 9.8 s for 256 px tiles with room). Counting the
// workspace the search wants makes the choice trade tile size for fast convolutions; with it,
// the untiled decode's estimate (15.0 GiB) is what it measured (15.5 GiB with the weights).
func GPUScratch() Scratch {
	const scoreBudget = 1 << 30
	most := envMiB("FRAMEPACK_CUDNN_WORKSPACE_MB", 8192)
	return Scratch{
		Conv: func(k [3]int, in, out [5]int, elem, welem int) int64 {
			// the input without the conv's padding: within a few percent for the decoder's convs
			io := convIOBytes(in, out, elem)
			n := min(max(2*io, 16<<20), most)
			if welem != elem {
				n += convWeightBytes(k, in[1], out[1], elem)
			}
			return n
		},
		Attention: func(lq, lk, _, _ int) int64 {
			return charged(min(int64(lq)*int64(lk)*4, scoreBudget))
		},
	}
}

// CUDAScratch is the cuda backend's scratch: GPUScratch's, except for 16-bit convs with 16-bit
// weights (a weight of another dtype makes native/gpu conv_vendor compute in f32), which run
// channels-last (native/gpu fpk_vendor_conv_nhwc, unless FRAMEPACK_CUDNN_LAYOUT=ncdhw) in
// slabs of output frames: one slab's input and output transposed into scratch (at most
// FRAMEPACK_CUDNN_SLAB_MB, default 1024 MiB), the weights transposed, and the workspace cuDNN's
// search offers then (find_workspace_want: half the slab's bytes, at least 16 MiB, at most
// FRAMEPACK_CUDNN_NHWC_WORKSPACE_MB, default 256 MiB; without layout transforms cuDNN's
// matrix-unit kernels need little). Those convs gather their padded, upsampled input into the
// slab (ReadsInPlace): no padded copy.
func CUDAScratch() Scratch {
	s := GPUScratch()
	if os.Getenv("FRAMEPACK_CUDNN_LAYOUT") == "ncdhw" {
		return s
	}
	most, slab := envMiB("FRAMEPACK_CUDNN_NHWC_WORKSPACE_MB", 256), envMiB("FRAMEPACK_CUDNN_SLAB_MB", 1024)
	ncdhw := s.Conv
	s.Conv = func(k [3]int, in, out [5]int, elem, welem int) int64 {
		if elem != 2 || welem != elem {
			// f32, or a weight of another dtype: the conv computes in f32, NCDHW
			return ncdhw(k, in, out, elem, welem)
		}
		io := min(convIOBytes(in, out, elem), slab)
		return convWeightBytes(k, in[1], out[1], elem) + charged(io) + min(max(io/2, 16<<20), most)
	}
	s.ReadsInPlace = func(elem, welem int) bool { return elem == 2 && welem == elem }
	return s
}

// envMiB is the size the environment variable name gives in MiB, in bytes: defMiB when it is
// unset, not a number or under 16, as the native side reads it (native/gpu fpk_env_mib).
func envMiB(name string, defMiB int64) int64 {
	if mb, err := strconv.ParseInt(os.Getenv(name), 10, 64); err == nil && mb >= 16 {
		return mb << 20
	}
	return defMiB << 20
}

// convIOBytes is the bytes of a conv's input and output.
func convIOBytes(in, out [5]int, elem int) int64 {
	return (int64(numel5(in)) + int64(numel5(out))) * int64(elem)
}

// convWeightBytes is what a conv weight [cout, cin, k] in elem-byte elements is charged.
func convWeightBytes(k [3]int, cin, cout, elem int) int64 {
	return charged(int64(cout) * int64(cin) * int64(k[0]*k[1]*k[2]) * int64(elem))
}

// FootprintOptions describe how a tile runs, for the memory estimate.
type FootprintOptions struct {
	ActivationBytes int // element size of the activations (4 for f32)
	WeightBytes     int // element size of the conv weights
	Scratch         Scratch
}

// charged is what the runtime's allocator charges for a buffer of n bytes (native/src
// fpk_core.c: blocks of 1 MiB and more are rounded up to 64 KiB).
func charged(n int64) int64 {
	const cacheMin, round = 1 << 20, 64 << 10
	if n < cacheMin {
		return n
	}
	return (n + round - 1) / round * round
}

// memSim follows the bytes a forward holds, op by op, as the model code allocates and frees
// them (nn.Pass: Then frees a step's input after the step; a block's first resnet frees the
// block's input once read). TestFootprintEstimate keeps it in step with the model code.
type memSim struct {
	o          FootprintOptions
	live, peak int64
	at, peakAt string // the step being walked, and the one that held the peak
	groups     int    // norm groups (whether a narrowing resnet splits: ResnetBlock.canSplit)
}

func (s *memSim) bytes(sh [5]int) int64 {
	return charged(int64(s.o.ActivationBytes) * int64(numel5(sh)))
}

func (s *memSim) alloc(sh [5]int) {
	s.live += s.bytes(sh)
	s.mark(s.live)
}

func (s *memSim) mark(n int64) {
	if n > s.peak {
		s.peak, s.peakAt = n, s.at
	}
}

func (s *memSim) free(sh [5]int) { s.live -= s.bytes(sh) }

// inPlace is Scratch.ReadsInPlace for the walk's dtypes.
func (s *memSim) inPlace() bool {
	return s.o.Scratch.ReadsInPlace != nil && s.o.Scratch.ReadsInPlace(s.o.ActivationBytes, s.o.WeightBytes)
}

// transient accounts n bytes held only during one op.
func (s *memSim) transient(n int64) {
	s.mark(s.live + n)
}

func withC(sh [5]int, c int) [5]int {
	sh[1] = c
	return sh
}

// conv is CausalConv3d.Forward on x (x stays live): the conv of x replicate padded (kT−1
// before, k/2 around), with a padded copy made for it unless the backend reads the padding in
// place (Scratch.ReadsInPlace). Returns the output shape (allocated).
func (s *memSim) conv(x [5]int, cout int, k int, stride [3]int) [5]int {
	kk := [3]int{k, k, k}
	out := x
	out[1] = cout
	for i := range 3 {
		st := max(stride[i], 1)
		out[2+i] = (x[2+i]-1)/st + 1
	}
	scratch := s.o.Scratch.Conv(kk, x, out, s.o.ActivationBytes, s.o.WeightBytes)
	if k == 1 || s.inPlace() {
		s.alloc(out)
		s.transient(scratch)
		return out
	}
	padded := x
	padded[2] += k - 1
	padded[3] += k - 1
	padded[4] += k - 1
	s.alloc(padded)
	s.alloc(out)
	s.transient(scratch)
	s.free(padded)
	return out
}

// resnet is ResnetBlock.Consume: x is freed once read (after norm1 with a shortcut, which
// runs first; at the end without one, x being the residual); returns the output (allocated).
func (s *memSim) resnet(x [5]int, cout int) [5]int {
	s.at = fmt.Sprintf("resnet %d→%d at %v", x[1], cout, x[2:])
	shortcut := x[1] != cout
	var sc [5]int
	if shortcut {
		sc = s.conv(x, cout, 1, unit)
	}
	var h [5]int
	if shortcut && x[1] > cout && x[1]%2 == 0 && s.groups%2 == 0 {
		// halves of the input channels (ResnetBlock.halvesConv1)
		half := withC(x, x[1]/2)
		s.alloc(half)
		s.alloc(half)
		s.free(x)
		var outs [2][5]int
		for i := range 2 {
			s.alloc(half) // norm1 + silu of the half
			s.free(half)  // the slice
			outs[i] = s.conv(half, cout, 3, unit)
			s.free(half)
		}
		h = outs[0]
		s.alloc(h) // the sum
		s.free(outs[0])
		s.free(outs[1])
	} else {
		n1 := x
		s.alloc(n1) // norm1 + silu (one op)
		if shortcut {
			s.free(x)
		}
		h = s.conv(n1, cout, 3, unit)
		s.free(n1)
	}
	s.alloc(h) // norm2 + silu
	s.free(h)
	h2 := s.conv(h, cout, 3, unit)
	s.free(h)
	s.alloc(h2) // + residual
	s.free(h2)
	if shortcut {
		s.free(sc)
	} else {
		s.free(x)
	}
	return h2
}

// attention is Attention.Forward on x [B, C, T, H, W] (x stays live).
func (s *memSim) attention(x [5]int) [5]int {
	s.at = fmt.Sprintf("attention at %v", x[2:])
	B, C, T, HW := x[0], x[1], x[2], x[3]*x[4]
	tok := func(l int) [5]int { return [5]int{B, 1, 1, l, C} }
	L := T * HW
	s.alloc(x) // group norm
	s.alloc(x) // permute
	s.free(x)
	s.alloc(tok(L)) // q
	s.alloc(tok(L)) // k
	s.alloc(tok(L)) // v
	s.free(x)       // tokens dropped
	for t := range T {
		var held [][5]int
		if T > 1 {
			held = append(held, tok(HW))
		}
		if t < T-1 {
			held = append(held, tok((t+1)*HW), tok((t+1)*HW))
		}
		for _, h := range held {
			s.alloc(h)
		}
		s.alloc(tok(HW)) // this frame's output, kept
		s.transient(s.o.Scratch.Attention(HW, (t+1)*HW, C, s.o.ActivationBytes))
		for _, h := range held {
			s.free(h)
		}
	}
	for range 3 {
		s.free(tok(L)) // q, k, v
	}
	if T > 1 {
		s.alloc(tok(L)) // concat
		for range T {
			s.free(tok(HW))
		}
	}
	s.alloc(tok(L)) // to_out
	s.free(tok(L))
	s.alloc(x) // permute back
	s.free(x)
	s.alloc(x) // + x
	s.free(x)
	return x
}

// mid is MidBlock.Forward (x is consumed by the first resnet).
func (s *memSim) mid(x [5]int, attention bool) [5]int {
	h := s.resnet(x, x[1])
	if attention {
		a := s.attention(h)
		s.free(h)
		h = a
	}
	h2 := s.resnet(h, x[1])
	return h2
}

// resnets runs the block's resnets from x, each consuming its input.
func (s *memSim) resnets(x [5]int, b blockPlan) [5]int {
	h := s.resnet(x, b.out)
	for range b.layers - 1 {
		h = s.resnet(h, b.out)
	}
	return h
}

// upBlock is UpBlock.Forward (x is consumed by the first resnet).
func (s *memSim) upBlock(x [5]int, b blockPlan) [5]int {
	h := s.resnets(x, b)
	if !b.resampled() {
		return h
	}
	// UpsampleCausal3D: the conv of h upsampled and causally padded, read in place where the
	// backend can (else the core makes that tensor for the call)
	s.at = fmt.Sprintf("upsampler %d at %v", h[1], h[2:])
	out := h
	out[1] = b.out
	out[2] = 1 + b.stride[0]*(h[2]-1)
	out[3] *= b.stride[1]
	out[4] *= b.stride[2]
	// the conv reads h upsampled: an input of the output's extent
	scratch := s.o.Scratch.Conv([3]int{3, 3, 3}, withC(out, h[1]), out, s.o.ActivationBytes, s.o.WeightBytes)
	if s.inPlace() {
		s.alloc(out)
		s.transient(scratch)
		s.free(h)
		return out
	}
	padded := h
	padded[2], padded[3], padded[4] = out[2]+2, out[3]+2, out[4]+2
	s.alloc(padded)
	s.alloc(out)
	s.transient(scratch)
	s.free(padded)
	s.free(h)
	return out
}

// downBlock is DownBlock.Forward (x is consumed by the first resnet).
func (s *memSim) downBlock(x [5]int, b blockPlan) [5]int {
	h := s.resnets(x, b)
	if !b.resampled() {
		return h
	}
	out := s.conv(h, b.out, 3, b.stride)
	s.free(h)
	return out
}

// normAct is conv_norm_out and SiLU (one op) on x (x stays live); returns the activation.
func (s *memSim) normAct(x [5]int) [5]int {
	s.at = fmt.Sprintf("norm_out and conv_out at %v", x[2:])
	s.alloc(x)
	return x
}

// decodeSim walks decodeTile for latents of shape z.
func (c Config) decodeSim(z [5]int, o FootprintOptions) *memSim {
	s := &memSim{o: o, at: "post_quant_conv and conv_in", groups: c.NormNumGroups}
	s.alloc(z)                                // upload (held until the tile ends)
	h := s.conv(z, c.LatentChannels, 1, unit) // post_quant_conv
	last := c.BlockOutChannels[len(c.BlockOutChannels)-1]
	x := s.conv(h, last, 3, unit) // conv_in
	s.free(h)
	x = s.mid(x, c.MidBlockAddAttention)
	for _, b := range c.upPlan() {
		x = s.upBlock(x, b)
	}
	a := s.normAct(x)
	s.free(x)
	out := s.conv(a, c.OutChannels, 3, unit)
	s.free(a)
	// the output is downloaded while held
	_ = out
	return s
}

// encodeSim walks encodeTile for pixels of shape in.
func (c Config) encodeSim(in [5]int, o FootprintOptions) *memSim {
	s := &memSim{o: o, at: "conv_in", groups: c.NormNumGroups}
	s.alloc(in) // upload (held until the tile ends)
	x := s.conv(in, c.BlockOutChannels[0], 3, unit)
	for _, b := range c.downPlan() {
		x = s.downBlock(x, b)
	}
	y := s.mid(x, c.MidBlockAddAttention)
	a := s.normAct(y)
	s.free(y)
	out := s.conv(a, 2*c.LatentChannels, 3, unit)
	s.free(a)
	q := s.conv(out, 2*c.LatentChannels, 1, unit) // quant_conv
	s.free(out)
	_ = q
	return s
}

// smallScratch covers the ops' small scratch the walk does not follow (group norm statistics,
// attention bookkeeping: tens of KiB on the tiny model).
const smallScratch = 1 << 20

// planPeak is the most bytes any tile of p holds (one sample at a time) and the step holding
// them.
func (c Config) planPeak(in [5]int, p plan, encode bool, o FootprintOptions) (int64, string) {
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
	var at string
	for _, t := range axis(p.temporal, in[2]) {
		for _, h := range axis(p.h, in[3]) {
			for _, w := range axis(p.w, in[4]) {
				sh := [5]int{1, in[1], t, h, w}
				var sim *memSim
				if encode {
					sim = c.encodeSim(sh, o)
				} else {
					sim = c.decodeSim(sh, o)
				}
				if sim.peak > peak {
					peak, at = sim.peak, sim.peakAt
				}
			}
		}
	}
	return peak + smallScratch, at
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
	PeakBytes int64  // estimated bytes one tile holds at most (activations and scratch)
	PeakAt    string // the step of the forward that holds them (for logs)
	Work      int64  // voxels computed over all tiles (relative time)
	Runs      int    // model runs per sample
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
	p, err := m.makePlan(in, t, encode)
	if err != nil {
		return TilingChoice{}, err
	}
	ch := TilingChoice{Tiling: t, Work: m.Config.planWork(in, p, encode), Runs: p.runs}
	ch.PeakBytes, ch.PeakAt = m.Config.planPeak(in, p, encode, o)
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
	base := DefaultTiling()
	first, err := m.Estimate(in, base, encode, o)
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
		ch, err := m.Estimate(in, t, encode, o)
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

// BackendScratch is the scratch model of the runtime m runs on.
func (m *Model) BackendScratch() Scratch {
	if b := m.rt.Backend(); !b.IsHost {
		return ScratchFor(b.Name)
	}
	return CPUScratch()
}

// AutoTiling chooses the tiling of an encode (encode true) or decode of an input of shape in
// from the memory the runtime's cap leaves now (Budget): ChooseTiling with the backend's
// scratch. It also returns the budget (math.MaxInt64 with none).
func (m *Model) AutoTiling(in [5]int, encode bool) (TilingChoice, int64, error) {
	budget, _, err := m.Budget()
	if err != nil {
		return TilingChoice{}, 0, err
	}
	ch, err := m.ChooseTiling(in, encode, budget, m.Footprint(m.BackendScratch()))
	return ch, budget, err
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
