package dit

import (
	"context"
	"fmt"
	"math"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// Tracer sees named intermediates of a forward (the fixture's names: "x_embedder" (as tokens
// [1, L, dim]), "temb", "context_embedder", "packed_hidden_states", "rope_freqs",
// "double_block_0_hidden", "last_single_block_hidden"). The tensor is only valid during the call.
type Tracer func(name string, t *runtime.Tensor)

// ForwardOptions are a forward's optional parts.
type ForwardOptions struct {
	// TeaCache, when non-nil and enabled, may skip the blocks (see TeaCache).
	TeaCache *TeaCache
	// MagCache, when non-nil and enabled, may skip the blocks (see MagCache); not together
	// with an enabled TeaCache.
	MagCache *MagCache
	// Trace receives intermediates (tests).
	Trace Tracer
}

// Forward runs the transformer on noisy latents x (float32 of the section's shape) at
// timestep and guidance (the values the reference embeds: σ·1000 and gs·1000) and returns the
// predicted flow velocity, float32 of the same shape.
func (m *Model) Forward(ctx context.Context, s *Section, x []float32, timestep, guidance float32, opts ForwardOptions) ([]float32, error) {
	out, err := m.forward(ctx, s, x, timestep, guidance, opts)
	if err != nil {
		return nil, fmt.Errorf("transformer forward: %w", err)
	}
	return out, nil
}

func (m *Model) forward(ctx context.Context, s *Section, x []float32, timestep, guidance float32, opts ForwardOptions) ([]float32, error) {
	if s == nil || s.m != m {
		return nil, invalidf("section prepared by another model")
	}
	shape := s.shape
	if n := shape[0] * shape[1] * shape[2] * shape[3] * shape[4]; len(x) != n {
		return nil, invalidf("hidden_states has %d values, the section's latents %v have %d", len(x), shape, n)
	}
	if err := checkFinite("hidden_states", x); err != nil {
		return nil, err
	}
	for name, v := range map[string]float32{"timestep": timestep, "guidance": guidance} {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, invalidf("%s is %v", name, v)
		}
	}
	trace := opts.Trace
	if trace == nil {
		trace = func(string, *runtime.Tensor) {}
	}
	rt := m.rt
	p := nn.NewPass(nil, rt)
	defer p.Free()
	defer m.releaseSlots()

	// Image stream: [clean | noisy] tokens.
	xt := p.Do(rt.FromFloat32As(m.act, x, shape[:]...))
	noisy := m.XEmbedder.Proj.Forward(p, xt)
	p.Drop(xt)
	if !p.OK() {
		return nil, p.Err()
	}
	trace("x_embedder", noisy)
	img := noisy
	if s.clean != nil {
		img = p.Do(rt.Concat(1, s.clean, noisy))
		p.Drop(noisy)
	}
	if !p.OK() {
		return nil, p.Err()
	}
	trace("packed_hidden_states", img)
	if opts.Trace != nil {
		if rf, err := s.ropeTable(); err == nil {
			trace("rope_freqs", rf)
			rf.Free()
		}
	}

	temb := m.TimeTextEmbed.Forward(p, timestep, guidance, s.pooled)
	text := m.ContextEmbedder.Forward(p, s.text, s.meanText, timestep, s.textMask)
	if !p.OK() {
		return nil, p.Err()
	}
	trace("temb", temb)
	trace("context_embedder", text)
	if text.Dim(1) != s.textKeep {
		text = p.Do(rt.Slice(text, 1, 0, s.textKeep))
	}
	txt := text
	if s.image != nil {
		txt = p.Do(rt.Concat(1, s.image, text))
	}
	if !p.OK() {
		return nil, p.Err()
	}

	cache, err := m.blockCache(opts)
	if err != nil {
		return nil, err
	}
	compute := true
	if cache != nil {
		if compute, err = cache.decide(p, img, temb); err != nil {
			return nil, err
		}
	}

	if compute {
		out, err := m.blocks(ctx, img, txt, temb, s.rope, trace)
		if err != nil {
			return nil, err
		}
		if cache != nil {
			res := p.Do(rt.Sub(out, img))
			if !p.OK() {
				out.Free()
				return nil, p.Err()
			}
			cache.setResidual(p.Keep(res))
		}
		img = p.Do(out, nil)
	} else {
		img = p.Do(rt.Add(img, cache.cached()))
	}

	h := m.NormOut.Forward(p, img, temb)
	if !p.OK() {
		return nil, p.Err()
	}
	if h.Dim(1) != s.noisyLen {
		h = p.Do(rt.Slice(h, 1, h.Dim(1)-s.noisyLen, h.Dim(1)))
	}
	o := m.ProjOut.Forward(p, h)
	if !p.OK() {
		return nil, p.Err()
	}
	flat, err := o.Float32()
	if err != nil {
		return nil, err
	}
	v := m.unpatchify(flat, shape)
	if err := checkFinite("velocity", v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNonFinite, err)
	}
	return v, nil
}

// blockCache is what skips the blocks of a forward: TeaCache or MagCache. decide says whether
// the blocks run; when they do, the forward hands it their residual (output − input); when they
// do not, the input plus the cached residual stands in for their output.
type blockCache interface {
	decide(p *nn.Pass, img, temb *runtime.Tensor) (bool, error)
	setResidual(r *runtime.Tensor)
	cached() *runtime.Tensor
}

// teaCacheBlocks is TeaCache as a blockCache of model m.
type teaCacheBlocks struct {
	m *Model
	t *TeaCache
}

func (c teaCacheBlocks) decide(p *nn.Pass, img, temb *runtime.Tensor) (bool, error) {
	mod := c.m.teaCacheInput(p, img, temb)
	if !p.OK() {
		return false, p.Err()
	}
	compute, err := c.t.decide(mod, img)
	p.Drop(mod)
	return compute, err
}

func (c teaCacheBlocks) setResidual(r *runtime.Tensor) { c.t.setResidual(r) }
func (c teaCacheBlocks) cached() *runtime.Tensor       { return c.t.residual }

// magCacheBlocks is MagCache as a blockCache.
type magCacheBlocks struct{ c *MagCache }

func (c magCacheBlocks) decide(_ *nn.Pass, img, _ *runtime.Tensor) (bool, error) {
	return c.c.decide(img), nil
}

func (c magCacheBlocks) setResidual(r *runtime.Tensor) { c.c.setResidual(r) }
func (c magCacheBlocks) cached() *runtime.Tensor       { return c.c.residual }

// blockCache is the forward's enabled block cache, nil for none.
func (m *Model) blockCache(opts ForwardOptions) (blockCache, error) {
	tea := opts.TeaCache != nil && opts.TeaCache.Enabled
	mag := opts.MagCache != nil && opts.MagCache.Enabled
	switch {
	case tea && mag:
		return nil, invalidf("TeaCache and MagCache are both enabled; use one")
	case tea:
		return teaCacheBlocks{m: m, t: opts.TeaCache}, nil
	case mag:
		return magCacheBlocks{c: opts.MagCache}, nil
	}
	return nil, nil
}

// teaCacheInput is transformer_blocks[0].norm1's modulated image input: TeaCache's
// change detector.
func (m *Model) teaCacheInput(p *nn.Pass, img, temb *runtime.Tensor) *runtime.Tensor {
	if len(m.TransformerBlocks) == 0 {
		p.Fail(fmt.Errorf("%w: TeaCache needs at least one double block", ErrUnsupportedConfig))
		return nil
	}
	blk, err := m.doubleBlock(0)
	if err != nil {
		p.Fail(err)
		return nil
	}
	a := blk.Norm1.Forward(p, img, temb)
	return a.x
}

// blocks runs the double and single blocks on img [1, Li, dim] and txt [1, Lt, dim] and
// returns the new image stream (the caller owns it); img and txt are not freed.
func (m *Model) blocks(ctx context.Context, img, txt, temb *runtime.Tensor, r rope, trace Tracer) (*runtime.Tensor, error) {
	li := img.Dim(1)
	cur, curTxt := img, txt
	release := func(t, keep *runtime.Tensor) {
		if t != keep {
			t.Free()
		}
	}
	for i := range m.TransformerBlocks {
		if err := ctx.Err(); err != nil {
			release(cur, img)
			release(curTxt, txt)
			return nil, err
		}
		blk, err := m.doubleBlock(i)
		if err != nil {
			release(cur, img)
			release(curTxt, txt)
			return nil, err
		}
		ni, nt, err := blk.Forward(m.rt, cur, curTxt, temb, r)
		release(cur, img)
		release(curTxt, txt)
		if err == nil {
			if err = m.double.Computed(i); err != nil {
				ni.Free()
				nt.Free()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("transformer_blocks.%d: %w", i, err)
		}
		cur, curTxt = ni, nt
		if i == 0 {
			trace("double_block_0_hidden", cur)
		}
	}
	// The double blocks' slots go before the single blocks' are made.
	m.double.Release()
	if len(m.SingleTransformerBlocks) == 0 {
		release(curTxt, txt)
		if cur == img {
			return m.rt.Copy(img)
		}
		return cur, nil
	}
	x, err := m.rt.Concat(1, cur, curTxt)
	release(cur, img)
	release(curTxt, txt)
	if err != nil {
		return nil, err
	}
	for i := range m.SingleTransformerBlocks {
		if err := ctx.Err(); err != nil {
			x.Free()
			return nil, err
		}
		blk, err := m.singleBlock(i)
		if err != nil {
			x.Free()
			return nil, err
		}
		nx, err := blk.Forward(m.rt, x, temb, r)
		x.Free()
		if err == nil {
			if err = m.single.Computed(i); err != nil {
				nx.Free()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("single_transformer_blocks.%d: %w", i, err)
		}
		x = nx
	}
	out, err := m.rt.Slice(x, 1, 0, li)
	x.Free()
	if err != nil {
		return nil, err
	}
	trace("last_single_block_hidden", out)
	return out, nil
}

// doubleBlock returns double block i with its weights in the runtime's memory: the resident
// block, or the streamed one copied into a slot, with the next streamed block copied into the
// other slot before block i computes (one block ahead).
func (m *Model) doubleBlock(i int) (HunyuanVideoTransformerBlock, error) {
	if !m.double.Streamed(i) {
		return m.TransformerBlocks[i], nil
	}
	blk, err := m.double.Use(i)
	if err == nil {
		err = m.double.Prefetch(i)
	}
	return blk, err
}

// singleBlock is doubleBlock for single block i.
func (m *Model) singleBlock(i int) (HunyuanVideoSingleTransformerBlock, error) {
	if !m.single.Streamed(i) {
		return m.SingleTransformerBlocks[i], nil
	}
	blk, err := m.single.Use(i)
	if err == nil {
		err = m.single.Prefetch(i)
	}
	return blk, err
}

// unpatchify is 'b (t h w) (c pt ph pw) -> b c (t pt) (h ph) (w pw)' with pt = 1.
func (m *Model) unpatchify(flat []float32, shape [5]int) []float32 {
	ps := m.Config.PatchSize
	C, T, H, W := m.Config.OutChannelsOrIn(), shape[2], shape[3], shape[4]
	h, w := H/ps, W/ps
	out := make([]float32, C*T*H*W)
	row := C * ps * ps
	for t := range T {
		for y := range h {
			for x := range w {
				tok := flat[((t*h+y)*w+x)*row:]
				for c := range C {
					for py := range ps {
						for px := range ps {
							out[((c*T+t)*H+y*ps+py)*W+x*ps+px] = tok[(c*ps+py)*ps+px]
						}
					}
				}
			}
		}
	}
	return out
}
