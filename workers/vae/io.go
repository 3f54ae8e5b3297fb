package main

import (
	"fmt"
	"math"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
	"github.com/framepackd/framepackd/workers/vae/causalvae"
)

// readVolume reads the input tensor as float32 [B, C, T, H, W] of finite values.
func readVolume(field string, r workerkit.TensorRef) (causalvae.Volume, error) {
	data, s, err := tensorio.ReadFloat(field, r, 5)
	if err != nil {
		return causalvae.Volume{}, err
	}
	var shape [5]int
	for i, d := range s {
		if d < 1 || d > math.MaxInt32 {
			return causalvae.Volume{}, workerkit.InvalidArgumentf("%s: shape %v has an empty or huge dim", field, s)
		}
		shape[i] = int(d)
	}
	for _, v := range data {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return causalvae.Volume{}, workerkit.InvalidArgumentf("%s: not finite (%v)", field, v)
		}
	}
	v, err := causalvae.WrapVolume(shape, data)
	if err != nil {
		return causalvae.Volume{}, workerkit.InvalidArgumentf("%s: %v", field, err)
	}
	return v, nil
}

// volumeOutput is output field at ref, a volume of shape.
func volumeOutput(field string, ref workerkit.TensorRef, shape [5]int) tensorio.Output {
	return tensorio.Output{Field: field, Ref: ref, Shape: tensorio.Shape64(shape[:])}
}

// target returns where output i of outs, a volume of shape, can be computed into: the segment's
// own mapping when it is F32 (direct), else a host volume to pass to put.
func target(outs *tensorio.Outputs, i int, shape [5]int) (causalvae.Volume, bool, error) {
	f, direct, err := outs.Target(i)
	if err != nil || !direct {
		return causalvae.NewVolume(shape), false, err
	}
	v, err := causalvae.WrapVolume(shape, f)
	return v, true, err
}

// put writes v as output i of outs, planned with shape.
func put(outs *tensorio.Outputs, i int, v causalvae.Volume, shape [5]int) error {
	if v.Shape != shape {
		return fmt.Errorf("output %d: %v, planned %v", i, v.Shape, shape)
	}
	return outs.PutFloat(i, v.Data)
}
