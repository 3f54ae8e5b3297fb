package dit

import (
	"fmt"
	"math"
	"slices"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
)

// Conditioning is one branch of what the transformer is conditioned on besides the noisy
// latents, the timestep and the guidance (batch 1 only).
type Conditioning = conditioning.Conditioning

// Section is a Conditioning embedded once for one latent shape: everything the forwards of a
// section share (clean-latent tokens, rope table, projected image states, cropped text). Close it
// when the section is done.
type Section struct {
	m     *Model
	shape [5]int // [1, C, T, H, W]

	clean    *runtime.Tensor // [1, Lc, dim] packed [4x | 2x | 1x] tokens; nil without clean latents
	cleanLen int
	noisyLen int // T·(H/p)·(W/p)
	rope     rope

	text     *runtime.Tensor // text states fed to the refiner [1, Lt', text_embed_dim]
	textMask *runtime.Tensor // refiner mask [1, 1, Lt', Lt'] when the mask is not leading ones; else nil
	textKeep int             // text tokens kept after the refiner (the reference's crop)
	meanText *runtime.Tensor // masked mean of the text states [1, text_embed_dim]
	pooled   *runtime.Tensor // CLIP pooled [1, pooled_projection_dim]
	image    *runtime.Tensor // projected SigLIP tokens [1, Li, dim]; nil without image projection

	sc runtime.Scope
}

// Shape returns the latent shape the section was prepared for.
func (s *Section) Shape() [5]int { return s.shape }

// Tokens returns the image-stream length (clean + noisy tokens) and the encoder length (SigLIP
// + kept text tokens).
func (s *Section) Tokens() (image, encoder int) {
	enc := s.textKeep
	if s.image != nil {
		enc += s.image.Dim(1)
	}
	return s.cleanLen + s.noisyLen, enc
}

// Close frees the section's tensors.
func (s *Section) Close() { s.sc.Free() }

func checkFinite(name string, v []float32) error {
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return invalidf("%s holds a non-finite value (%v at element %d)", name, x, i)
		}
	}
	return nil
}

func checkTensor(name string, t conditioning.Tensor, want []int) error {
	if !slices.Equal(t.Shape, want) {
		return invalidf("%s has shape %v, expected %v", name, t.Shape, want)
	}
	n := 1
	for _, d := range want {
		n *= d
	}
	if len(t.Data) != n {
		return invalidf("%s has %d values for shape %v", name, len(t.Data), want)
	}
	return checkFinite(name, t.Data)
}

// indices checks a [1, n] index tensor and returns its values.
func indices(name string, t conditioning.IntTensor, n int) ([]int64, error) {
	if !slices.Equal(t.Shape, []int{1, n}) || len(t.Data) != n {
		return nil, invalidf("%s has shape %v (%d values), expected [1 %d] to match the latents", name, t.Shape, len(t.Data), n)
	}
	for _, v := range t.Data {
		if v < 0 || v > 1<<20 {
			return nil, invalidf("%s holds frame index %d", name, v)
		}
	}
	return t.Data, nil
}

// forceMaskedRefiner makes Prepare take the masked refiner path for every mask (tests).
var forceMaskedRefiner bool

// Prepare validates c for latents of shape [1, C, T, H, W] and embeds what the section's
// forwards share. Errors about the inputs match ErrInvalidInput.
func (m *Model) Prepare(c Conditioning, shape [5]int) (*Section, error) {
	s, err := m.prepare(c, shape)
	if err != nil {
		return nil, fmt.Errorf("prepare section: %w", err)
	}
	return s, nil
}

func (m *Model) prepare(c Conditioning, shape [5]int) (*Section, error) {
	cfg := m.Config
	ps := cfg.PatchSize
	B, C, T, H, W := shape[0], shape[1], shape[2], shape[3], shape[4]
	if B != 1 {
		return nil, invalidf("batch size %d: only batch 1 is supported (the text is cropped to its mask, as the reference does for batch 1)", B)
	}
	if C != cfg.InChannels || T < 1 || H < ps || W < ps || H%ps != 0 || W%ps != 0 {
		return nil, invalidf("latent shape %v: need [1 %d T H W] with H and W multiples of patch_size %d", shape, cfg.InChannels, ps)
	}
	h, w := H/ps, W/ps

	// Text: shape, 0/1 mask, at least one token.
	td := cfg.TextEmbedDim
	if len(c.EncoderHiddenStates.Shape) != 3 || c.EncoderHiddenStates.Shape[0] != 1 {
		return nil, invalidf("encoder_hidden_states has shape %v, expected [1 L %d]", c.EncoderHiddenStates.Shape, td)
	}
	L := c.EncoderHiddenStates.Shape[1]
	if err := checkTensor("encoder_hidden_states", c.EncoderHiddenStates, []int{1, L, td}); err != nil {
		return nil, err
	}
	if !slices.Equal(c.EncoderAttentionMask.Shape, []int{1, L}) || len(c.EncoderAttentionMask.Data) != L {
		return nil, invalidf("encoder_attention_mask has shape %v, expected [1 %d]", c.EncoderAttentionMask.Shape, L)
	}
	real, prefix := 0, true
	for i, v := range c.EncoderAttentionMask.Data {
		switch v {
		case 1:
			real++
			prefix = prefix && real == i+1
		case 0:
		default:
			return nil, invalidf("encoder_attention_mask holds %d at %d (want 0 or 1)", v, i)
		}
	}
	if real == 0 {
		return nil, invalidf("encoder_attention_mask selects no text token")
	}
	if err := checkTensor("pooled_projections", c.PooledProjections, []int{1, cfg.PooledProjectionDim}); err != nil {
		return nil, err
	}

	// Latent indices and the clean context.
	latentIdx := c.LatentIndices.Data
	if len(c.LatentIndices.Shape) == 0 && len(latentIdx) == 0 {
		latentIdx = make([]int64, T)
		for i := range latentIdx {
			latentIdx[i] = int64(i)
		}
	} else {
		var err error
		if latentIdx, err = indices("latent_indices", c.LatentIndices, T); err != nil {
			return nil, err
		}
	}
	type cleanIn struct {
		name string
		x    conditioning.Tensor
		idx  conditioning.IntTensor
	}
	cleans := []cleanIn{ // packed order: 4x, 2x, 1x
		{"clean_latents_4x", c.CleanLatents4x, c.CleanLatent4xIndices},
		{"clean_latents_2x", c.CleanLatents2x, c.CleanLatent2xIndices},
		{"clean_latents", c.CleanLatents, c.CleanLatentIndices},
	}
	var cleanIdx [3][]int64
	for i, cl := range cleans {
		hasX, hasIdx := cl.x.Set(), cl.idx.Set()
		if !hasX && !hasIdx {
			continue
		}
		if hasX != hasIdx {
			return nil, invalidf("%s and its indices must be given together", cl.name)
		}
		if m.CleanXEmbedder == nil {
			return nil, invalidf("%s given but the model has no clean_x_embedder (has_clean_x_embedder is false)", cl.name)
		}
		if len(cl.x.Shape) != 5 {
			return nil, invalidf("%s has shape %v, expected [1 %d T %d %d]", cl.name, cl.x.Shape, cleanInChannels, H, W)
		}
		tc := cl.x.Shape[2]
		if err := checkTensor(cl.name, cl.x, []int{1, cleanInChannels, tc, H, W}); err != nil {
			return nil, err
		}
		idx, err := indices(cl.name+" indices", cl.idx, tc)
		if err != nil {
			return nil, err
		}
		cleanIdx[i] = idx
	}

	var img conditioning.Tensor
	if m.ImageProjection != nil {
		img = c.ImageEmbeddings
		if len(img.Shape) != 3 {
			return nil, invalidf("image_embeddings has shape %v, expected [1 Li %d] (the model has an image projection)", img.Shape, cfg.ImageProjDim)
		}
		if err := checkTensor("image_embeddings", img, []int{1, img.Shape[1], cfg.ImageProjDim}); err != nil {
			return nil, err
		}
	}

	s := &Section{m: m, shape: shape, noisyLen: T * h * w}
	p := nn.NewPass(nil, m.rt)
	defer p.Free()
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	own := func(t *runtime.Tensor) *runtime.Tensor {
		t = p.Keep(t)
		if t != nil {
			s.sc.Add(t)
		}
		return t
	}

	// Clean tokens and rope rows, packed [4x | 2x | 1x | noisy].
	var tokens, ropes []*runtime.Tensor
	for i, cl := range cleans {
		if cleanIdx[i] == nil {
			continue
		}
		x := p.Do(m.rt.FromFloat32As(m.act, cl.x.Data, cl.x.Shape...))
		var conv PatchConv
		var pool [3]int
		switch i {
		case 0:
			conv, pool = m.CleanXEmbedder.Proj4x, [3]int{4, 4, 4}
		case 1:
			conv, pool = m.CleanXEmbedder.Proj2x, [3]int{2, 2, 2}
		default:
			conv, pool = m.CleanXEmbedder.Proj, [3]int{1, 1, 1}
		}
		tokens = append(tokens, conv.Forward(p, padTo(p, x, conv.Kernel)))
		ropes = append(ropes, m.Rope.Forward(p, cleanIdx[i], h, w, pool))
	}
	ropes = append(ropes, m.Rope.Forward(p, latentIdx, h, w, [3]int{1, 1, 1}))
	if len(tokens) > 0 {
		s.clean = own(p.Do(m.rt.Concat(1, tokens...)))
		if p.OK() {
			s.cleanLen = s.clean.Dim(1)
		}
	}

	// Text for the refiner: the real tokens alone when the mask is leading ones (exact: they
	// attend only to each other in the reference too); otherwise all of them with the mask.
	textData, textLen := c.EncoderHiddenStates.Data, L
	if prefix && !forceMaskedRefiner {
		textData, textLen = textData[:real*td], real
	} else {
		mask := make([]uint8, L*L)
		md := c.EncoderAttentionMask.Data
		for i := range L {
			for j := range L {
				if (md[i] == 1 && md[j] == 1) || j == 0 {
					mask[i*L+j] = 1
				}
			}
		}
		s.textMask = own(p.Do(m.rt.FromUint8(mask, 1, 1, L, L)))
	}
	s.textKeep = real
	s.text = own(p.Do(m.rt.FromFloat32As(m.act, textData, 1, textLen, td)))
	mean := make([]float64, td)
	for i, v := range c.EncoderAttentionMask.Data {
		if v == 1 {
			for j, x := range c.EncoderHiddenStates.Data[i*td : (i+1)*td] {
				mean[j] += float64(x)
			}
		}
	}
	mean32 := make([]float32, td)
	for j := range mean {
		mean32[j] = float32(mean[j] / float64(real))
	}
	s.meanText = own(p.Do(m.rt.FromFloat32As(m.act, mean32, 1, td)))
	s.pooled = own(p.Do(m.rt.FromFloat32As(m.act, c.PooledProjections.Data, 1, cfg.PooledProjectionDim)))
	encLen := s.textKeep
	if m.ImageProjection != nil {
		x := p.Do(m.rt.FromFloat32As(m.act, img.Data, img.Shape...))
		s.image = own(m.ImageProjection.Forward(p, x))
		encLen += img.Shape[1]
	}

	// Rope for the joint sequence: image-stream rows, then identity rows for the encoder tokens.
	d := cfg.AttentionHeadDim
	ident := make([]float32, encLen*2*d)
	for i := range encLen {
		for j := range d {
			ident[i*2*d+j] = 1
		}
	}
	ropes = append(ropes, p.Do(m.rt.FromFloat32(ident, 1, encLen, 2*d)))
	all := p.Do(m.rt.Concat(1, ropes...))
	if !p.OK() {
		return nil, p.Err()
	}
	n := all.Dim(1)
	if want := s.cleanLen + s.noisyLen + encLen; n != want {
		return nil, fmt.Errorf("internal: rope table has %d rows, sequence has %d", n, want)
	}
	cos := p.Do(m.rt.Slice(all, -1, 0, d))
	sin := p.Do(m.rt.Slice(all, -1, d, 2*d))
	s.rope.cos = own(p.Reshape(cos, 1, n, 1, d))
	s.rope.sin = own(p.Reshape(sin, 1, n, 1, d))
	// the image stream's rows alone, for the double blocks' image q/k (their text q/k get none)
	if li := s.cleanLen + s.noisyLen; p.OK() {
		s.rope.imgCos = own(p.Do(m.rt.Slice(s.rope.cos, 1, 0, li)))
		s.rope.imgSin = own(p.Do(m.rt.Slice(s.rope.sin, 1, 0, li)))
	}
	if !p.OK() {
		return nil, p.Err()
	}
	ok = true
	return s, nil
}

// ropeTable returns the image stream's rope table [1, L, 2·D] (cos | sin), for tests.
func (s *Section) ropeTable() (*runtime.Tensor, error) {
	p := nn.NewPass(nil, s.m.rt)
	defer p.Free()
	li := s.cleanLen + s.noisyLen
	c := p.Do(s.m.rt.Slice(s.rope.cos, 1, 0, li))
	sn := p.Do(s.m.rt.Slice(s.rope.sin, 1, 0, li))
	cat := p.Do(s.m.rt.Concat(-1, c, sn))
	if !p.OK() {
		return nil, p.Err()
	}
	return p.Keep(p.Reshape(cat, 1, li, -1)), p.Err()
}
