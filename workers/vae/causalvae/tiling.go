package causalvae

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Tiling is how a stage splits its work, with the meaning and defaults of diffusers'
// AutoencoderKLHunyuanVideo: framewise (temporal) encoding and decoding are on by default,
// spatial tiling is off until enabled (enable_tiling). Sizes are in pixels and pixel frames.
type Tiling struct {
	// Spatial is diffusers' use_tiling: split height and width into overlapping tiles when
	// the input is larger than one tile.
	Spatial bool
	// FramewiseEncoding encodes more than TileSampleMinNumFrames frames in chunks.
	FramewiseEncoding bool
	// FramewiseDecoding decodes more than TileSampleMinNumFrames/4 latent frames in chunks.
	FramewiseDecoding bool

	TileSampleMinHeight       int // tile height (default 256)
	TileSampleMinWidth        int // tile width (default 256)
	TileSampleMinNumFrames    int // chunk length in frames (default 16)
	TileSampleStrideHeight    int // vertical tile stride (default 192)
	TileSampleStrideWidth     int // horizontal tile stride (default 192)
	TileSampleStrideNumFrames int // chunk stride in frames (default 12)
}

// DefaultTiling returns diffusers' defaults: framewise on, spatial tiling off, 256/192 px
// tiles, 16/12 frame chunks.
func DefaultTiling() Tiling {
	return Tiling{
		FramewiseEncoding:         true,
		FramewiseDecoding:         true,
		TileSampleMinHeight:       256,
		TileSampleMinWidth:        256,
		TileSampleMinNumFrames:    16,
		TileSampleStrideHeight:    192,
		TileSampleStrideWidth:     192,
		TileSampleStrideNumFrames: 12,
	}
}

// Validate refuses sizes diffusers' arithmetic cannot handle: a stride of zero latent
// samples, or a stride larger than the tile (the tiles would leave gaps).
func (t Tiling) Validate(c Config) error {
	sc, tc := c.SpatialCompressionRatio, c.TemporalCompressionRatio
	if t.Spatial {
		for _, d := range []struct {
			name         string
			tile, stride int
		}{{"height", t.TileSampleMinHeight, t.TileSampleStrideHeight}, {"width", t.TileSampleMinWidth, t.TileSampleStrideWidth}} {
			if d.stride/sc < 1 || d.tile/sc < 1 {
				return badInput("tile %s %d and stride %d must be at least %d pixels", d.name, d.tile, d.stride, sc)
			}
			if d.stride > d.tile {
				return badInput("tile %s stride %d is larger than the tile (%d)", d.name, d.stride, d.tile)
			}
		}
	}
	if t.FramewiseEncoding || t.FramewiseDecoding {
		if t.TileSampleStrideNumFrames/tc < 1 || t.TileSampleMinNumFrames < 1 {
			return badInput("chunk of %d frames and stride %d: the stride must be at least %d frames",
				t.TileSampleMinNumFrames, t.TileSampleStrideNumFrames, tc)
		}
		if t.TileSampleStrideNumFrames > t.TileSampleMinNumFrames {
			return badInput("chunk stride %d frames is larger than the chunk (%d)",
				t.TileSampleStrideNumFrames, t.TileSampleMinNumFrames)
		}
	}
	return nil
}

// RunOptions configure one encode or decode.
type RunOptions struct {
	Tiling Tiling
	// Progress, when set, is called after each tile (model run) with the number done and
	// the total; an error stops the stage and is returned.
	Progress func(done, total int) error
}

// axisTile is one tile along one axis: the input range it reads, how many of its output
// samples are dropped first (1 for temporal chunks after the first), how many it has left,
// and where its kept (cropped) samples land in the assembled output.
type axisTile struct {
	in0, in1 int
	drop     int
	n        int // output samples after the drop
	crop     int // leading samples kept after blending
	at       int // offset of the kept samples in the output
}

// axisPlan tiles one axis.
type axisPlan struct {
	tiles []axisTile
	blend int // blend extent in output samples
	total int // assembled output length (after the final crop)
}

// planAxis mirrors diffusers' loops: tiles start at range(0, n, stride) and read `span`
// samples; outSize maps an input length to an output length; chunk drops the first output
// sample of every tile but the first and keeps crop+1 samples of the first one (temporal
// tiling); target is the final crop of the concatenation.
func planAxis(n, span, stride int, outSize func(int) int, blendN, crop, target int, chunk bool) axisPlan {
	p := axisPlan{blend: blendN}
	sum := 0
	for i := 0; i < n; i += stride {
		t := axisTile{in0: i, in1: min(i+span, n)}
		t.n = outSize(t.in1 - t.in0)
		keep := crop
		if chunk {
			if i > 0 {
				t.drop = 1
			} else {
				keep = crop + 1
			}
		}
		t.n = max(t.n-t.drop, 0)
		t.crop = min(t.n, keep)
		t.at = sum
		sum += t.crop
		p.tiles = append(p.tiles, t)
	}
	p.total = min(sum, target)
	return p
}

// plan is how one stage runs: optional temporal chunks, optional spatial tiles in each.
type plan struct {
	temporal *axisPlan
	h, w     *axisPlan
	out      [5]int // assembled output shape
	runs     int    // model runs (per batch sample: samples run one after another)
}

// spatialPlans plans the spatial tiles of an input of h×w (in input units) when tiling
// applies, returning nil plans otherwise.
func (m *Model) spatialPlans(h, w int, t Tiling, encode bool) (ph, pw *axisPlan) {
	sc := m.Config.SpatialCompressionRatio
	if encode {
		if !t.Spatial || !(w > t.TileSampleMinWidth || h > t.TileSampleMinHeight) {
			return nil, nil
		}
		enc := func(axis int) func(int) int { return func(n int) int { return m.Config.EncodedSize(axis, n) } }
		a := planAxis(h, t.TileSampleMinHeight, t.TileSampleStrideHeight, enc(1),
			t.TileSampleMinHeight/sc-t.TileSampleStrideHeight/sc, t.TileSampleStrideHeight/sc, h/sc, false)
		b := planAxis(w, t.TileSampleMinWidth, t.TileSampleStrideWidth, enc(2),
			t.TileSampleMinWidth/sc-t.TileSampleStrideWidth/sc, t.TileSampleStrideWidth/sc, w/sc, false)
		return &a, &b
	}
	tileH, tileW := t.TileSampleMinHeight/sc, t.TileSampleMinWidth/sc
	if !t.Spatial || !(w > tileW || h > tileH) {
		return nil, nil
	}
	dec := func(axis int) func(int) int { return func(n int) int { return m.Config.DecodedSize(axis, n) } }
	a := planAxis(h, tileH, t.TileSampleStrideHeight/sc, dec(1),
		t.TileSampleMinHeight-t.TileSampleStrideHeight, t.TileSampleStrideHeight, h*sc, false)
	b := planAxis(w, tileW, t.TileSampleStrideWidth/sc, dec(2),
		t.TileSampleMinWidth-t.TileSampleStrideWidth, t.TileSampleStrideWidth, w*sc, false)
	return &a, &b
}

// makePlan plans an encode (in: pixels) or a decode (in: latents), as diffusers' _encode /
// _decode choose between framewise, tiled and direct paths.
func (m *Model) makePlan(in [5]int, t Tiling, encode bool) (plan, error) {
	c := m.Config
	if err := t.Validate(c); err != nil {
		return plan{}, err
	}
	wantC := c.LatentChannels
	if encode {
		wantC = c.InChannels
	}
	if in[1] != wantC {
		return plan{}, badInput("input has %d channels, the model takes %d", in[1], wantC)
	}
	for i, d := range in {
		if d < 1 {
			return plan{}, badInput("input shape %v has an empty dim %d", in, i)
		}
	}
	B, T, H, W := in[0], in[2], in[3], in[4]
	size := c.DecodedSize
	outC := c.OutChannels
	if encode {
		size = c.EncodedSize
		outC = 2 * c.LatentChannels
	}
	p := plan{out: [5]int{B, outC, size(0, T), size(1, H), size(2, W)}}
	tc := c.TemporalCompressionRatio
	tileLatT, strideLatT := t.TileSampleMinNumFrames/tc, t.TileSampleStrideNumFrames/tc
	switch {
	case encode && t.FramewiseEncoding && T > t.TileSampleMinNumFrames:
		a := planAxis(T, t.TileSampleMinNumFrames+1, t.TileSampleStrideNumFrames,
			func(n int) int { return c.EncodedSize(0, n) },
			tileLatT-strideLatT, strideLatT, (T-1)/tc+1, true)
		p.temporal = &a
	case !encode && t.FramewiseDecoding && T > tileLatT:
		a := planAxis(T, tileLatT+1, strideLatT,
			func(n int) int { return c.DecodedSize(0, n) },
			t.TileSampleMinNumFrames-t.TileSampleStrideNumFrames, t.TileSampleStrideNumFrames, (T-1)*tc+1, true)
		p.temporal = &a
	}
	p.h, p.w = m.spatialPlans(H, W, t, encode)
	if p.temporal != nil {
		p.out[2] = p.temporal.total
	}
	if p.h != nil {
		p.out[3], p.out[4] = p.h.total, p.w.total
	}
	grid := 1
	if p.h != nil {
		grid = len(p.h.tiles) * len(p.w.tiles)
	}
	p.runs = grid
	if p.temporal != nil {
		p.runs = 0
		for _, tt := range p.temporal.tiles {
			if tt.n > 0 {
				p.runs += grid
			}
		}
	}
	return p, nil
}

// tileFunc runs the model on one tile.
type tileFunc func(ctx context.Context, in Volume) (Volume, error)

// executor runs a plan, counting model runs for progress.
type executor struct {
	ctx  context.Context
	p    plan
	run  tileFunc
	opts RunOptions
	done int
}

func (e *executor) runTile(in Volume) (Volume, error) {
	if err := e.ctx.Err(); err != nil {
		return Volume{}, fmt.Errorf("forward: %w", err)
	}
	out, err := e.run(e.ctx, in)
	if err != nil {
		return Volume{}, err
	}
	e.done++
	if e.opts.Progress != nil {
		if err := e.opts.Progress(e.done, e.p.runs*e.p.out[0]); err != nil {
			return Volume{}, err
		}
	}
	return out, nil
}

// hostQueue runs functions one after another, in the order given, on a goroutine of its own:
// the host's blending and copying of one tile's output overlaps the device's work on the next
// tile instead of leaving the device idle (24 tiles of a full-size decode spent about 1.5 s
// there on an H100). At most two functions wait; after one fails the rest are skipped and
// failed reports it, so the caller stops running tiles.
type hostQueue struct {
	fns    chan func() error
	result chan error
	bad    atomic.Bool
}

func newHostQueue() *hostQueue {
	s := &hostQueue{fns: make(chan func() error, 2), result: make(chan error, 1)}
	go func() {
		var first error
		for fn := range s.fns {
			if first == nil {
				if first = fn(); first != nil {
					s.bad.Store(true)
				}
			}
		}
		s.result <- first
	}()
	return s
}

func (s *hostQueue) do(fn func() error) { s.fns <- fn }
func (s *hostQueue) failed() bool       { return s.bad.Load() }

// wait returns the first function's error once all have run (or were skipped).
func (s *hostQueue) wait() error {
	close(s.fns)
	return <-s.result
}

// frames runs one temporal chunk (all frames of in): spatially tiled or whole.
func (e *executor) frames(in Volume) (Volume, error) {
	if e.p.h == nil {
		return e.runTile(in)
	}
	ph, pw := e.p.h, e.p.w
	var out Volume
	// the blending state below belongs to the host queue's goroutine once the loop starts
	prevRow := make([]Volume, len(pw.tiles))
	row := make([]Volume, len(pw.tiles))
	host := newHostQueue()
	var err error
	for i, ti := range ph.tiles {
		for j, tj := range pw.tiles {
			if host.failed() {
				break
			}
			var res Volume
			if res, err = e.runTile(in.sub(0, in.Shape[2], ti.in0, ti.in1, tj.in0, tj.in1)); err != nil {
				break
			}
			if res.Shape[3] != ti.n || res.Shape[4] != tj.n {
				err = fmt.Errorf("tile [%d:%d, %d:%d] gave %v, planned %d×%d", ti.in0, ti.in1, tj.in0, tj.in1,
					res.Shape, ti.n, tj.n)
				break
			}
			host.do(func() error {
				if out.Data == nil {
					out = NewVolume([5]int{res.Shape[0], res.Shape[1], res.Shape[2], ph.total, pw.total})
				}
				if j == 0 && i > 0 {
					prevRow, row = row, prevRow
				}
				// blend the tile above and the tile to the left into this one (in place, so
				// the blended tile is what its right and lower neighbours see, as in diffusers)
				if i > 0 {
					if err := blend(prevRow[j], res, 3, ph.blend); err != nil {
						return err
					}
				}
				if j > 0 {
					if err := blend(row[j-1], res, 4, pw.blend); err != nil {
						return err
					}
				}
				row[j] = res
				hh := min(ti.crop, ph.total-ti.at)
				ww := min(tj.crop, pw.total-tj.at)
				copyRegion(out, [5]int{0, 0, 0, ti.at, tj.at}, res, [5]int{}, [5]int{res.Shape[0], res.Shape[1], res.Shape[2], hh, ww})
				return nil
			})
		}
		if err != nil || host.failed() {
			break
		}
	}
	if herr := host.wait(); err == nil {
		err = herr
	}
	if err != nil {
		return Volume{}, err
	}
	return out, nil
}

// sample returns sample b of v as a [1, C, T, H, W] volume sharing v's data.
func (v Volume) sample(b int) Volume {
	s := v.Shape
	s[0] = 1
	n := numel5(s)
	return Volume{Shape: s, Data: v.Data[b*n : (b+1)*n]}
}

// execute runs the plan on in and writes the assembled output into dst (shape p.out). Batch
// samples run one after another, as diffusers' use_slicing does (every op is per sample, so
// the result is the same and the runtime holds one sample's tile).
func (e *executor) execute(in, dst Volume) error {
	if dst.Shape != e.p.out || len(dst.Data) != numel5(dst.Shape) {
		return fmt.Errorf("output volume %v, planned %v", dst.Shape, e.p.out)
	}
	for b := range in.Shape[0] {
		if err := e.executeSample(in.sample(b), dst.sample(b)); err != nil {
			return err
		}
	}
	return nil
}

// executeSample is execute for one sample (in and dst have batch 1).
func (e *executor) executeSample(in, dst Volume) error {
	if e.p.temporal == nil {
		res, err := e.frames(in)
		if err != nil {
			return err
		}
		if res.Shape != dst.Shape {
			return fmt.Errorf("output %v, planned %v", res.Shape, dst.Shape)
		}
		copy(dst.Data, res.Data)
		return nil
	}
	pt := e.p.temporal
	var prev Volume // the host queue's
	host := newHostQueue()
	var err error
	for k, tk := range pt.tiles {
		if host.failed() {
			break
		}
		var res Volume
		if tk.n == 0 {
			// a chunk whose only output frame is dropped: nothing to compute or blend
			res = NewVolume([5]int{dst.Shape[0], dst.Shape[1], 0, dst.Shape[3], dst.Shape[4]})
		} else {
			if res, err = e.frames(in.sub(tk.in0, tk.in1, 0, in.Shape[3], 0, in.Shape[4])); err != nil {
				break
			}
			if tk.drop > 0 {
				res = res.dropFirstFrames(tk.drop)
			}
		}
		if res.Shape[2] != tk.n || res.Shape[3] != dst.Shape[3] || res.Shape[4] != dst.Shape[4] {
			err = fmt.Errorf("chunk [%d:%d] gave %v, planned %d frames of %v", tk.in0, tk.in1, res.Shape, tk.n, dst.Shape)
			break
		}
		host.do(func() error {
			if k > 0 {
				if err := blend(prev, res, 2, pt.blend); err != nil {
					return err
				}
			}
			n := min(tk.crop, pt.total-tk.at)
			copyRegion(dst, [5]int{0, 0, tk.at, 0, 0}, res, [5]int{}, [5]int{res.Shape[0], res.Shape[1], n, res.Shape[3], res.Shape[4]})
			prev = res
			return nil
		})
	}
	if herr := host.wait(); err == nil {
		err = herr
	}
	return err
}

// Tiles returns how many model runs (tiles, per batch sample) an encode (encode true) or decode of an input of
// shape in takes with tiling t.
func (m *Model) Tiles(in [5]int, t Tiling, encode bool) (int, error) {
	p, err := m.makePlan(in, t, encode)
	if err != nil {
		return 0, err
	}
	return p.runs, nil
}

// EncodedShape returns the shape of the posterior mean (and log-variance) that Encode gives
// for pixels of shape x, or an ErrBadInput error.
func (m *Model) EncodedShape(x [5]int, t Tiling) ([5]int, error) {
	p, err := m.makePlan(x, t, true)
	if err != nil {
		return [5]int{}, err
	}
	out := p.out
	out[1] /= 2
	return out, nil
}

// DecodedShape returns the shape of the pixels Decode gives for latents of shape z, or an
// ErrBadInput error.
func (m *Model) DecodedShape(z [5]int, t Tiling) ([5]int, error) {
	p, err := m.makePlan(z, t, false)
	if err != nil {
		return [5]int{}, err
	}
	return p.out, nil
}

// EncodeMoments encodes pixels x [B, in, T, H, W] in [-1, 1] to the posterior's parameters
// [B, 2·latent, T', H', W'] (mean channels first), tiled as opts says.
func (m *Model) EncodeMoments(ctx context.Context, x Volume, opts RunOptions) (Volume, error) {
	p, err := m.makePlan(x.Shape, opts.Tiling, true)
	if err != nil {
		return Volume{}, err
	}
	if len(x.Data) != numel5(x.Shape) {
		return Volume{}, badInput("input has %d values for shape %v", len(x.Data), x.Shape)
	}
	out := NewVolume(p.out)
	e := &executor{ctx: ctx, p: p, run: m.encodeTile, opts: opts}
	if err := e.execute(x, out); err != nil {
		return Volume{}, fmt.Errorf("encode: %w", err)
	}
	return out, nil
}

// Encode encodes pixels x [B, in, T, H, W] in [-1, 1] into mean and logvar (shape
// EncodedShape), as DiagonalGaussianDistribution splits the moments: logvar is clamped to
// [-30, 20]. The caller scales the latent by Config.ScalingFactor.
func (m *Model) Encode(ctx context.Context, x Volume, opts RunOptions) (mean, logvar Volume, err error) {
	mom, err := m.EncodeMoments(ctx, x, opts)
	if err != nil {
		return Volume{}, Volume{}, err
	}
	s := mom.Shape
	half := s
	half[1] /= 2
	mean, logvar = NewVolume(half), NewVolume(half)
	copyRegion(mean, [5]int{}, mom, [5]int{}, half)
	copyRegion(logvar, [5]int{}, mom, [5]int{0, half[1], 0, 0, 0}, half)
	for i, v := range logvar.Data {
		logvar.Data[i] = min(max(v, -30), 20)
	}
	return mean, logvar, nil
}

// DecodeInto decodes latents z [B, latent, T, h, w] (already divided by the scaling factor)
// into dst, whose shape must be DecodedShape(z.Shape). dst may be a shared-memory mapping:
// only finished tiles are written to it, and the runtime holds one tile at a time.
func (m *Model) DecodeInto(ctx context.Context, z Volume, opts RunOptions, dst Volume) error {
	p, err := m.makePlan(z.Shape, opts.Tiling, false)
	if err != nil {
		return err
	}
	if len(z.Data) != numel5(z.Shape) {
		return badInput("latents have %d values for shape %v", len(z.Data), z.Shape)
	}
	e := &executor{ctx: ctx, p: p, run: m.decodeTile, opts: opts}
	if err := e.execute(z, dst); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}

// Decode decodes latents z [B, latent, T, h, w] (already divided by the scaling factor) into
// pixels [B, out, 4T−3, 8h, 8w] (roughly in [-1, 1]).
func (m *Model) Decode(ctx context.Context, z Volume, opts RunOptions) (Volume, error) {
	shape, err := m.DecodedShape(z.Shape, opts.Tiling)
	if err != nil {
		return Volume{}, err
	}
	out := NewVolume(shape)
	if err := m.DecodeInto(ctx, z, opts, out); err != nil {
		return Volume{}, err
	}
	return out, nil
}
