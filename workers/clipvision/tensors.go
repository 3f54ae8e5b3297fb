package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// errBadRequest marks request problems (missing refs, wrong dtype or shape of an input or a
// requested output); they map to InvalidArgument.
var errBadRequest = errors.New("bad request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

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
	if ref.Path == "" || ref.Name == "" {
		return nil, badRequest("image: path and name are required")
	}
	seg, err := shm.Open(ref.Path)
	if err != nil {
		return nil, badRequest("image: %v", err)
	}
	ok := false
	defer func() {
		if !ok {
			seg.Close()
		}
	}()
	info, found := seg.Info(ref.Name)
	if !found {
		return nil, badRequest("image: no tensor %q in %s", ref.Name, ref.Path)
	}
	if info.DType != safetensors.U8 {
		return nil, badRequest("image %q: dtype %s, want U8", ref.Name, info.DType)
	}
	if ref.DType != "" && ref.DType != info.DType {
		return nil, badRequest("image %q: request says dtype %s, file has %s", ref.Name, ref.DType, info.DType)
	}
	if len(ref.Shape) > 0 && !slices.Equal(ref.Shape, info.Shape) {
		return nil, badRequest("image %q: request says shape %v, file has %v", ref.Name, ref.Shape, info.Shape)
	}
	s := info.Shape
	m := &image{seg: seg}
	switch len(s) {
	case 2:
		m.height, m.width, m.channels = int(s[0]), int(s[1]), 1
	case 3:
		m.height, m.width, m.channels = int(s[0]), int(s[1]), int(s[2])
	default:
		return nil, badRequest("image %q: shape %v, want [H, W, C] (or [H, W] for gray)", ref.Name, s)
	}
	if m.height <= 0 || m.width <= 0 {
		return nil, badRequest("image %q: shape %v is empty", ref.Name, s)
	}
	if m.channels < 1 || m.channels > 4 {
		return nil, badRequest("image %q: shape %v: %d channels, want 1, 2, 3 or 4", ref.Name, s, m.channels)
	}
	if m.pix, err = seg.Bytes(ref.Name); err != nil {
		return nil, badRequest("image %q: %v", ref.Name, err)
	}
	ok = true
	return m, nil
}

// checkOutputRef validates the output ref and returns the dtype to write (F32 unless the
// request asks for F16 or BF16).
func checkOutputRef(ref workerkit.TensorRef) (safetensors.DType, error) {
	if ref.Path == "" || ref.Name == "" {
		return "", badRequest("last_hidden_state: path and name are required")
	}
	switch ref.DType {
	case "":
		return safetensors.F32, nil
	case safetensors.F32, safetensors.F16, safetensors.BF16:
		return ref.DType, nil
	}
	return "", badRequest("last_hidden_state: dtype %s, want F32, F16 or BF16", ref.DType)
}

// writeOutput writes last_hidden_state as the segment ref.Path (ref.Name inside) and returns the
// ref as written.
func writeOutput(ref workerkit.TensorRef, dt safetensors.DType, values []float32, shape []int) (workerkit.TensorRef, error) {
	s := make([]int64, len(shape))
	for i, d := range shape {
		s[i] = int64(d)
	}
	if len(ref.Shape) > 0 && !slices.Equal(ref.Shape, s) {
		return ref, badRequest("last_hidden_state: request says shape %v, the model gives %v", ref.Shape, s)
	}
	var t safetensors.Tensor
	switch dt {
	case safetensors.F32:
		t = safetensors.FromFloat32(ref.Name, s, values)
	default:
		b := make([]byte, 2*len(values))
		for i, v := range values {
			h := safetensors.F32ToBF16(v)
			if dt == safetensors.F16 {
				h = safetensors.F32ToF16(v)
			}
			binary.LittleEndian.PutUint16(b[2*i:], h)
		}
		t = safetensors.Tensor{Name: ref.Name, DType: dt, Shape: s, Data: b}
	}
	if _, err := shm.WriteSegment(ref.Path, []safetensors.Tensor{t}); err != nil {
		return ref, fmt.Errorf("write last_hidden_state: %w", err)
	}
	ref.DType, ref.Shape = dt, s
	return ref, nil
}

// hostRSS returns the process's resident memory from /proc/self/statm.
func hostRSS() (uint64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("statm: %q", b)
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("statm: %w", err)
	}
	return pages * uint64(os.Getpagesize()), nil
}
