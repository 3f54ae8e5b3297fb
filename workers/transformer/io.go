package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// checkRef checks that a tensor reference names a tensor in an absolute, complete-segment path.
func checkRef(field string, r workerkit.TensorRef) error {
	switch {
	case r.Path == "" || r.Name == "":
		return invalidf("%s: path and name are required", field)
	case !filepath.IsAbs(r.Path):
		return invalidf("%s: path %q is not absolute", field, r.Path)
	case strings.HasSuffix(r.Path, shm.PartialExt):
		return invalidf("%s: path %q names a partial file", field, r.Path)
	}
	return nil
}

// checkOutputRef checks an output reference.
func checkOutputRef(field string, r workerkit.TensorRef) error { return checkRef(field, r) }

// floatDType is the dtype an output is written in: the ref's (F32, F16 or BF16), F32 by default.
func floatDType(field string, r workerkit.TensorRef) (safetensors.DType, error) {
	switch r.DType {
	case "":
		return safetensors.F32, nil
	case safetensors.F32, safetensors.F16, safetensors.BF16:
		return r.DType, nil
	}
	return "", invalidf("%s: dtype %s (F32, F16 or BF16)", field, r.DType)
}

// checkOutputShape checks a shape the request asks for against the output's.
func checkOutputShape(field string, r workerkit.TensorRef, shape []int) error {
	if len(r.Shape) == 0 {
		return nil
	}
	want := make([]int64, len(shape))
	for i, d := range shape {
		want[i] = int64(d)
	}
	if !slices.Equal(r.Shape, want) {
		return invalidf("%s: shape %v asked, the output is %v", field, r.Shape, want)
	}
	return nil
}

// writeFloat writes v as a one-tensor segment at r (dtype as floatDType) and returns the ref as
// written.
func writeFloat(r workerkit.TensorRef, v []float32, shape []int) (workerkit.TensorRef, error) {
	dt, err := floatDType("output", r)
	if err != nil {
		return workerkit.TensorRef{}, err
	}
	var data []byte
	switch dt {
	case safetensors.F32:
		data = make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
		}
	default:
		data = make([]byte, 2*len(v))
		for i, x := range v {
			h := safetensors.F32ToF16(x)
			if dt == safetensors.BF16 {
				h = safetensors.F32ToBF16(x)
			}
			binary.LittleEndian.PutUint16(data[2*i:], h)
		}
	}
	s64 := make([]int64, len(shape))
	for i, d := range shape {
		s64[i] = int64(d)
	}
	if _, err := shm.WriteSegment(r.Path, []safetensors.Tensor{{Name: r.Name, DType: dt, Shape: s64, Data: data}}); err != nil {
		return workerkit.TensorRef{}, fmt.Errorf("write %s: %w", r.Path, err)
	}
	return workerkit.TensorRef{Path: r.Path, Name: r.Name, DType: dt, Shape: s64}, nil
}

// inputs reads input tensors from their segments, keeping the first error (later reads return
// empty tensors).
type inputs struct {
	err error
}

// open maps r's segment and checks the tensor against the dtype and shape r states.
func (in *inputs) open(field string, r workerkit.TensorRef) (*shm.Mapped, safetensors.TensorInfo, bool) {
	if in.err != nil {
		return nil, safetensors.TensorInfo{}, false
	}
	if err := checkRef(field, r); err != nil {
		in.err = err
		return nil, safetensors.TensorInfo{}, false
	}
	f, err := shm.Open(r.Path)
	if err != nil {
		in.err = invalidf("%s: %v", field, err)
		return nil, safetensors.TensorInfo{}, false
	}
	info, ok := f.Info(r.Name)
	switch {
	case !ok:
		in.err = invalidf("%s: no tensor %q in %s", field, r.Name, r.Path)
	case r.DType != "" && info.DType != r.DType:
		in.err = invalidf("%s: tensor is %s, the request says %s", field, info.DType, r.DType)
	case len(r.Shape) > 0 && !slices.Equal(info.Shape, r.Shape):
		in.err = invalidf("%s: tensor has shape %v, the request says %v", field, info.Shape, r.Shape)
	}
	if in.err != nil {
		f.Close()
		return nil, info, false
	}
	return f, info, true
}

// float reads a float tensor of the given rank.
func (in *inputs) float(field string, r workerkit.TensorRef, rank int) sampler.Tensor {
	f, info, ok := in.open(field, r)
	if !ok {
		return sampler.Tensor{}
	}
	defer f.Close()
	if !info.DType.IsFloat() || len(info.Shape) != rank {
		in.err = invalidf("%s: %s%v, want a rank-%d float tensor", field, info.DType, info.Shape, rank)
		return sampler.Tensor{}
	}
	v, shape, err := f.Float32(r.Name)
	if err != nil {
		in.err = invalidf("%s: %v", field, err)
		return sampler.Tensor{}
	}
	return sampler.Tensor{Shape: toInts(shape), Data: v}
}

// mask reads an attention mask ([1, L] of BOOL, U8 or an integer type).
func (in *inputs) mask(field string, r workerkit.TensorRef) sampler.IntTensor {
	f, info, ok := in.open(field, r)
	if !ok {
		return sampler.IntTensor{}
	}
	defer f.Close()
	if info.DType.IsFloat() || len(info.Shape) != 2 {
		in.err = invalidf("%s: %s%v, want a [1, L] mask", field, info.DType, info.Shape)
		return sampler.IntTensor{}
	}
	v, shape, err := f.Int64(r.Name)
	if err != nil {
		in.err = invalidf("%s: %v", field, err)
		return sampler.IntTensor{}
	}
	return sampler.IntTensor{Shape: toInts(shape), Data: v}
}

func toInts(s []int64) []int {
	out := make([]int, len(s))
	for i, d := range s {
		out[i] = int(d)
	}
	return out
}
