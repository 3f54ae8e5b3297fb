package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/workers/vae/causalvae"
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

// checkOutputRef checks an output reference and its dtype (F32, F16 or BF16).
func checkOutputRef(field string, r workerkit.TensorRef) error {
	if err := checkRef(field, r); err != nil {
		return err
	}
	switch r.DType {
	case "", safetensors.F32, safetensors.F16, safetensors.BF16:
		return nil
	}
	return invalidf("%s: dtype %s (F32, F16 or BF16)", field, r.DType)
}

// readVolume maps the input segment and reads the tensor as float32 [B, C, T, H, W].
func readVolume(field string, r workerkit.TensorRef) (causalvae.Volume, error) {
	if err := checkRef(field, r); err != nil {
		return causalvae.Volume{}, err
	}
	seg, err := shm.Open(r.Path)
	if err != nil {
		return causalvae.Volume{}, invalidf("%s: %v", field, err)
	}
	defer seg.Close()
	info, ok := seg.Info(r.Name)
	if !ok {
		return causalvae.Volume{}, invalidf("%s: no tensor %q in %s", field, r.Name, r.Path)
	}
	if r.DType != "" && r.DType != info.DType {
		return causalvae.Volume{}, invalidf("%s: dtype %s, the request says %s", field, info.DType, r.DType)
	}
	if len(r.Shape) > 0 && !slices.Equal(r.Shape, info.Shape) {
		return causalvae.Volume{}, invalidf("%s: shape %v, the request says %v", field, info.Shape, r.Shape)
	}
	if !info.DType.IsFloat() {
		return causalvae.Volume{}, invalidf("%s: dtype %s is not a float type", field, info.DType)
	}
	if len(info.Shape) != 5 {
		return causalvae.Volume{}, invalidf("%s: shape %v has rank %d, want 5 [B, C, T, H, W]", field, info.Shape, len(info.Shape))
	}
	var shape [5]int
	for i, d := range info.Shape {
		if d < 1 || d > math.MaxInt32 {
			return causalvae.Volume{}, invalidf("%s: shape %v has an empty or huge dim", field, info.Shape)
		}
		shape[i] = int(d)
	}
	data, _, err := seg.Float32(r.Name)
	if err != nil {
		return causalvae.Volume{}, invalidf("%s: %v", field, err)
	}
	for _, v := range data {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return causalvae.Volume{}, invalidf("%s: not finite (%v)", field, v)
		}
	}
	v, err := causalvae.WrapVolume(shape, data)
	if err != nil {
		return causalvae.Volume{}, invalidf("%s: %v", field, err)
	}
	return v, nil
}

// outputRef is one tensor a stage writes.
type outputRef struct {
	field string
	ref   workerkit.TensorRef
	shape [5]int
}

// outputs are a stage's output segments, open for writing: outputs that share a path share a
// file, written as "<path>.partial" and renamed by commit.
type outputs struct {
	refs    []outputRef
	dtypes  []safetensors.DType
	writers map[string]*shm.Writer
	paths   []string // in first-use order
}

func shape64(s [5]int) []int64 {
	out := make([]int64, 5)
	for i, d := range s {
		out[i] = int64(d)
	}
	return out
}

// newOutputs checks the references against the shapes the stage will produce and creates the
// segments (memory reserved up front, so a full /dev/shm fails here, not while writing).
func newOutputs(refs []outputRef) (*outputs, error) {
	o := &outputs{refs: refs, writers: map[string]*shm.Writer{}}
	specs := map[string][]shm.TensorSpec{}
	for _, r := range refs {
		if err := checkOutputRef(r.field, r.ref); err != nil {
			return nil, err
		}
		want := shape64(r.shape)
		if len(r.ref.Shape) > 0 && !slices.Equal(r.ref.Shape, want) {
			return nil, invalidf("%s: shape %v asked, the output is %v", r.field, r.ref.Shape, want)
		}
		dt := r.ref.DType
		if dt == "" {
			dt = safetensors.F32
		}
		o.dtypes = append(o.dtypes, dt)
		if _, ok := specs[r.ref.Path]; !ok {
			o.paths = append(o.paths, r.ref.Path)
		}
		for _, s := range specs[r.ref.Path] {
			if s.Name == r.ref.Name {
				return nil, invalidf("%s: tensor %q named twice in %s", r.field, s.Name, r.ref.Path)
			}
		}
		specs[r.ref.Path] = append(specs[r.ref.Path], shm.TensorSpec{Name: r.ref.Name, DType: dt, Shape: want})
	}
	for _, p := range o.paths {
		w, err := shm.Create(p, specs[p])
		if err != nil {
			o.abort()
			return nil, fmt.Errorf("create output: %w", err)
		}
		o.writers[p] = w
	}
	return o, nil
}

// target returns where output i can be computed into: the segment's own mapping when it is
// F32 (direct), else a host volume to pass to put.
func (o *outputs) target(i int) (causalvae.Volume, bool, error) {
	r := o.refs[i]
	if o.dtypes[i] != safetensors.F32 {
		return causalvae.NewVolume(r.shape), false, nil
	}
	b, err := o.writers[r.ref.Path].Bytes(r.ref.Name)
	if err != nil {
		return causalvae.Volume{}, false, err
	}
	// Segment data starts on a page boundary and tensors are aligned in it; the host is
	// little-endian like the file.
	f := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	v, err := causalvae.WrapVolume(r.shape, f)
	return v, true, err
}

// put writes v as output i, converting to its dtype.
func (o *outputs) put(i int, v causalvae.Volume) error {
	r := o.refs[i]
	if v.Shape != r.shape {
		return fmt.Errorf("%s: output %v, planned %v", r.field, v.Shape, r.shape)
	}
	dt := o.dtypes[i]
	var data []byte
	switch dt {
	case safetensors.F32:
		data = make([]byte, 4*len(v.Data))
		for j, x := range v.Data {
			binary.LittleEndian.PutUint32(data[4*j:], math.Float32bits(x))
		}
	case safetensors.F16, safetensors.BF16:
		data = make([]byte, 2*len(v.Data))
		for j, x := range v.Data {
			h := safetensors.F32ToF16(x)
			if dt == safetensors.BF16 {
				h = safetensors.F32ToBF16(x)
			}
			binary.LittleEndian.PutUint16(data[2*j:], h)
		}
	}
	if err := o.writers[r.ref.Path].Write(r.ref.Name, data); err != nil {
		return fmt.Errorf("%s: %w", r.field, err)
	}
	return nil
}

// commit renames every segment into place and returns the written references.
func (o *outputs) commit() ([]workerkit.TensorRef, error) {
	for _, p := range o.paths {
		if _, err := o.writers[p].Commit(); err != nil {
			o.abort()
			return nil, fmt.Errorf("commit output: %w", err)
		}
		delete(o.writers, p)
	}
	out := make([]workerkit.TensorRef, len(o.refs))
	for i, r := range o.refs {
		out[i] = workerkit.TensorRef{Path: r.ref.Path, Name: r.ref.Name, DType: o.dtypes[i], Shape: shape64(r.shape)}
	}
	return out, nil
}

// abort removes the partial files not committed.
func (o *outputs) abort() {
	for p, w := range o.writers {
		w.Abort()
		delete(o.writers, p)
	}
}
