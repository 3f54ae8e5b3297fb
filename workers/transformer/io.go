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

// text reads one prompt branch's text conditioning; suffix ("" or "_n") names its fields.
func (in *inputs) text(c *conditioning.Conditioning, t workerkit.TransformerText, suffix string) {
	c.EncoderHiddenStates = in.float("llama_vec"+suffix, t.LlamaVec, 3)
	c.EncoderAttentionMask = in.mask("llama_mask"+suffix, t.LlamaMask)
	c.PooledProjections = in.float("clip_pooler"+suffix, t.ClipPooler, 2)
}

// conditioning reads a request's conditioning: the text, the image embeddings and the clean
// latents (each optional: a ref naming nothing is left out) with their frame indices.
func (in *inputs) conditioning(r workerkit.TransformerConditioning) conditioning.Conditioning {
	optional := func(field string, ref workerkit.TensorRef, rank int) conditioning.Tensor {
		if ref.Path == "" && ref.Name == "" {
			return conditioning.Tensor{}
		}
		return in.float(field, ref, rank)
	}
	var c conditioning.Conditioning
	in.text(&c, r.TransformerText, "")
	c.ImageEmbeddings = optional("image_embeddings", r.ImageEmbeddings, 3)
	c.CleanLatents, c.CleanLatentIndices = optional("clean_latents", r.CleanLatents, 5), indexTensor(r.CleanLatentIndices)
	c.CleanLatents2x, c.CleanLatent2xIndices = optional("clean_latents_2x", r.CleanLatents2x, 5), indexTensor(r.CleanLatent2xIndices)
	c.CleanLatents4x, c.CleanLatent4xIndices = optional("clean_latents_4x", r.CleanLatents4x, 5), indexTensor(r.CleanLatent4xIndices)
	c.LatentIndices = indexTensor(r.LatentIndices)
	return c
}

// indexTensor is a request's frame index list as a [1, n] tensor (empty stays empty).
func indexTensor(v []int64) conditioning.IntTensor {
	if len(v) == 0 {
		return conditioning.IntTensor{}
	}
	return conditioning.IntTensor{Shape: []int{1, len(v)}, Data: v}
}
