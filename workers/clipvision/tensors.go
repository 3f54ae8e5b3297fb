package main

import (
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
)

// lastHiddenState is the request field of the stage's output.
const lastHiddenState = "last_hidden_state"

// image is the stage's input, mapped from shared memory.
type image struct {
	seg                     *shm.Mapped
	pix                     []uint8 // a view into the mapping, valid until close
	height, width, channels int
}

func (m *image) close() { m.seg.Close() }

// readImage maps the input tensor: uint8 [H, W, C] with C 1 (gray), 2 (gray + alpha), 3 (RGB)
// or 4 (RGBA), or [H, W] (gray).
func readImage(ref workerkit.TensorRef) (*image, error) {
	seg, info, err := tensorio.Open("image", ref)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			seg.Close()
		}
	}()
	if info.DType != safetensors.U8 {
		return nil, workerkit.InvalidArgumentf("image %q: dtype %s, want U8", ref.Name, info.DType)
	}
	s := info.Shape
	m := &image{seg: seg}
	switch len(s) {
	case 2:
		m.height, m.width, m.channels = int(s[0]), int(s[1]), 1
	case 3:
		m.height, m.width, m.channels = int(s[0]), int(s[1]), int(s[2])
	default:
		return nil, workerkit.InvalidArgumentf("image %q: shape %v, want [H, W, C] (or [H, W] for gray)", ref.Name, s)
	}
	if m.height <= 0 || m.width <= 0 {
		return nil, workerkit.InvalidArgumentf("image %q: shape %v is empty", ref.Name, s)
	}
	if m.channels < 1 || m.channels > 4 {
		return nil, workerkit.InvalidArgumentf("image %q: shape %v: %d channels, want 1, 2, 3 or 4", ref.Name, s, m.channels)
	}
	if m.pix, err = seg.Bytes(ref.Name); err != nil {
		return nil, workerkit.InvalidArgumentf("image %q: %v", ref.Name, err)
	}
	ok = true
	return m, nil
}
