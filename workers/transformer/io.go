package main

import (
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
)

// inputs reads input tensors from their segments, keeping the first error (later reads return
// empty tensors).
type inputs struct {
	err error
}

// float reads a float tensor of the given rank.
func (in *inputs) float(field string, r workerkit.TensorRef, rank int) conditioning.Tensor {
	if in.err != nil {
		return conditioning.Tensor{}
	}
	v, shape, err := tensorio.ReadFloat(field, r, rank)
	if err != nil {
		in.err = err
		return conditioning.Tensor{}
	}
	return conditioning.Tensor{Shape: toInts(shape), Data: v}
}

// mask reads an attention mask ([1, L] of BOOL, U8 or an integer type).
func (in *inputs) mask(field string, r workerkit.TensorRef) conditioning.IntTensor {
	if in.err != nil {
		return conditioning.IntTensor{}
	}
	f, info, err := tensorio.Open(field, r)
	if err != nil {
		in.err = err
		return conditioning.IntTensor{}
	}
	defer f.Close()
	if info.DType.IsFloat() || len(info.Shape) != 2 {
		in.err = workerkit.InvalidArgumentf("%s: %s%v, want a [1, L] mask", field, info.DType, info.Shape)
		return conditioning.IntTensor{}
	}
	v, shape, err := f.Int64(r.Name)
	if err != nil {
		in.err = workerkit.InvalidArgumentf("%s: %v", field, err)
		return conditioning.IntTensor{}
	}
	return conditioning.IntTensor{Shape: toInts(shape), Data: v}
}

func toInts(s []int64) []int {
	out := make([]int, len(s))
	for i, d := range s {
		out[i] = int(d)
	}
	return out
}
