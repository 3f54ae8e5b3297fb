package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/tokenizer"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
)

// The optional outputs of a text_encode stage (worker.proto TextEncodeRequest llama_ids,
// llama_attention_mask, clip_ids): the positive prompt's tokenizer outputs, as the models ran
// on them, so the tokenize fixture cases can be checked through the worker.

// refSet reports whether an optional output is asked for: a ref naming neither a file nor a
// tensor is not.
func refSet(r workerkit.TensorRef) bool { return r.Path != "" || r.Name != "" }

// tokenRef is one optional token output: the request's ref and what it may be written as.
type tokenRef struct {
	field   string
	ref     workerkit.TensorRef
	allowed []safetensors.DType // the first is the default
}

func tokenRefs(req *workerkit.TextEncodeRequest) []tokenRef {
	return []tokenRef{
		{"llama_ids", req.LlamaIDs, []safetensors.DType{safetensors.I64, safetensors.I32}},
		{"llama_attention_mask", req.LlamaAttentionMask, []safetensors.DType{safetensors.I64, safetensors.U8, safetensors.Bool}},
		{"clip_ids", req.ClipIDs, []safetensors.DType{safetensors.I64, safetensors.I32}},
	}
}

// checkTokenRefs checks the optional token outputs that are set (before any work is done).
func checkTokenRefs(req *workerkit.TextEncodeRequest) error {
	for _, r := range tokenRefs(req) {
		if !refSet(r.ref) {
			continue
		}
		if err := tensorio.CheckRef(r.field, r.ref); err != nil {
			return err
		}
		if r.ref.DType != "" && !slices.Contains(r.allowed, r.ref.DType) {
			return fmt.Errorf("%w: %s: dtype %s (one of %v)", ErrInvalidArgument, r.field, r.ref.DType, r.allowed)
		}
	}
	return nil
}

// tokens adds toks for the optional token outputs the request sets, in the order worker.proto
// lists them.
func (o *encoded) tokens(req *workerkit.TextEncodeRequest, toks tokenizer.PromptTokens) error {
	values := map[string][]int64{"llama_ids": toks.LlamaIDs, "llama_attention_mask": toks.LlamaMask, "clip_ids": toks.CLIPIDs}
	for _, r := range tokenRefs(req) {
		if !refSet(r.ref) {
			continue
		}
		v := values[r.field]
		dt, data, err := encodeInts(r, v)
		if err != nil {
			return err
		}
		o.add(r.field, r.ref, dt, []int64{1, int64(len(v))}, data)
	}
	return nil
}

// encodeInts encodes integer values in the dtype r asks for (its first allowed one by default).
func encodeInts(r tokenRef, v []int64) (safetensors.DType, []byte, error) {
	dt := r.ref.DType
	if dt == "" {
		dt = r.allowed[0]
	}
	var data []byte
	switch dt {
	case safetensors.I64:
		data = make([]byte, 8*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint64(data[8*i:], uint64(x))
		}
	case safetensors.I32:
		data = make([]byte, 4*len(v))
		for i, x := range v {
			if x < math.MinInt32 || x > math.MaxInt32 {
				return "", nil, fmt.Errorf("%s: value %d does not fit I32", r.field, x)
			}
			binary.LittleEndian.PutUint32(data[4*i:], uint32(int32(x)))
		}
	case safetensors.U8, safetensors.Bool:
		data = make([]byte, len(v))
		for i, x := range v {
			if x < 0 || x > 1 {
				return "", nil, fmt.Errorf("%s: value %d is not a 0/1 mask entry", r.field, x)
			}
			data[i] = byte(x)
		}
	default:
		return "", nil, fmt.Errorf("%w: %s: dtype %s (one of %v)", ErrInvalidArgument, r.field, dt, r.allowed)
	}
	return dt, data, nil
}
