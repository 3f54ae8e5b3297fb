package causalvae

import (
	"context"
	"fmt"
)

// Chunks splits t frames into runs of n (the last may be shorter): [start, end) pairs. n ≤ 0
// or n ≥ t is one run.
func Chunks(t, n int) [][2]int {
	if n <= 0 || n >= t {
		return [][2]int{{0, t}}
	}
	var out [][2]int
	for s := 0; s < t; s += n {
		out = append(out, [2]int{s, min(s+n, t)})
	}
	return out
}

// ChunkedShape is the shape EncodeChunks gives for pixels of shape x in runs of n frames: the
// runs' latent frames one after the other.
func (m *Model) ChunkedShape(x [5]int, n int, t Tiling) ([5]int, error) {
	var out [5]int
	for i, c := range Chunks(x[2], n) {
		cs := x
		cs[2] = c[1] - c[0]
		s, err := m.EncodedShape(cs, t)
		if err != nil {
			return out, err
		}
		if i == 0 {
			out = s
		} else {
			out[2] += s[2]
		}
	}
	return out, nil
}

// EncodeChunks encodes x's frames in independent runs of n frames (each run as Encode alone
// would encode it: its own causal padding, no context from the run before) and joins their
// latents in time, as FramePack-Studio's video_encode does with its vae_batch_size of 16.
func (m *Model) EncodeChunks(ctx context.Context, x Volume, n int, opts RunOptions) (mean, logvar Volume, err error) {
	chunks := Chunks(x.Shape[2], n)
	if len(chunks) == 1 {
		return m.Encode(ctx, x, opts)
	}
	shape, err := m.ChunkedShape(x.Shape, n, opts.Tiling)
	if err != nil {
		return Volume{}, Volume{}, err
	}
	mean, logvar = NewVolume(shape), NewVolume(shape)
	at := 0
	for _, c := range chunks {
		size := x.Shape
		size[2] = c[1] - c[0]
		part := NewVolume(size)
		copyRegion(part, [5]int{}, x, [5]int{0, 0, c[0], 0, 0}, size)
		mv, lv, err := m.Encode(ctx, part, opts)
		if err != nil {
			return Volume{}, Volume{}, fmt.Errorf("frames %d to %d: %w", c[0], c[1], err)
		}
		copyRegion(mean, [5]int{0, 0, at, 0, 0}, mv, [5]int{}, mv.Shape)
		copyRegion(logvar, [5]int{0, 0, at, 0, 0}, lv, [5]int{}, lv.Shape)
		at += mv.Shape[2]
	}
	return mean, logvar, nil
}
