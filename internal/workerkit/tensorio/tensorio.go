// Package tensorio reads a stage's input tensors from shared-memory segments and writes its
// outputs, as the tensor references of a RunRequest name them (worker.proto TensorRef): it
// checks each reference (an absolute path of a complete segment and a tensor name, the dtype
// and shape it states) and converts floats to the dtype an output asks for. Errors about the
// request wrap workerkit.ErrInvalidArgument and start with the request field they are about.
package tensorio

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
)

// CheckRef checks that r names a tensor in an absolute path of a complete segment.
func CheckRef(field string, r workerkit.TensorRef) error {
	switch {
	case r.Path == "" || r.Name == "":
		return workerkit.InvalidArgumentf("%s: path and name are required", field)
	case !filepath.IsAbs(r.Path):
		return workerkit.InvalidArgumentf("%s: path %q is not absolute", field, r.Path)
	case strings.HasSuffix(r.Path, shm.PartialExt):
		return workerkit.InvalidArgumentf("%s: path %q names a partial file", field, r.Path)
	}
	return nil
}

// CheckFloatOutput checks the reference of a float output and the dtype it asks for.
func CheckFloatOutput(field string, r workerkit.TensorRef) error {
	if err := CheckRef(field, r); err != nil {
		return err
	}
	_, err := FloatDType(field, r)
	return err
}

// FloatDType is the dtype a float output is written in: r's (F32, F16 or BF16), F32 by default.
func FloatDType(field string, r workerkit.TensorRef) (safetensors.DType, error) {
	switch r.DType {
	case "":
		return safetensors.F32, nil
	case safetensors.F32, safetensors.F16, safetensors.BF16:
		return r.DType, nil
	}
	return "", workerkit.InvalidArgumentf("%s: dtype %s, want F32, F16 or BF16", field, r.DType)
}

// CheckShape checks the shape r asks for, if any, against the shape the stage gives.
func CheckShape(field string, r workerkit.TensorRef, shape []int64) error {
	if len(r.Shape) > 0 && !slices.Equal(r.Shape, shape) {
		return workerkit.InvalidArgumentf("%s: shape %v asked, the model gives %v", field, r.Shape, shape)
	}
	return nil
}

// Shape64 converts a shape to the int64 dims of a tensor reference.
func Shape64[T ~int | ~int32](s []T) []int64 {
	out := make([]int64, len(s))
	for i, d := range s {
		out[i] = int64(d)
	}
	return out
}

// EncodeFloat encodes v little-endian as dt: F32, or F16/BF16 rounded to nearest even.
func EncodeFloat(dt safetensors.DType, v []float32) ([]byte, error) {
	switch dt {
	case safetensors.F32:
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return b, nil
	case safetensors.F16, safetensors.BF16:
		b := make([]byte, 2*len(v))
		for i, x := range v {
			h := safetensors.F32ToF16(x)
			if dt == safetensors.BF16 {
				h = safetensors.F32ToBF16(x)
			}
			binary.LittleEndian.PutUint16(b[2*i:], h)
		}
		return b, nil
	}
	return nil, fmt.Errorf("encode floats as %s: not a float dtype", dt)
}

// Open maps the segment r names and finds its tensor, checked against the dtype and shape r
// states. The caller closes the mapping.
func Open(field string, r workerkit.TensorRef) (*shm.Mapped, safetensors.TensorInfo, error) {
	if err := CheckRef(field, r); err != nil {
		return nil, safetensors.TensorInfo{}, err
	}
	f, err := shm.Open(r.Path)
	if err != nil {
		return nil, safetensors.TensorInfo{}, workerkit.InvalidArgumentf("%s: %v", field, err)
	}
	info, ok := f.Info(r.Name)
	switch {
	case !ok:
		err = workerkit.InvalidArgumentf("%s: no tensor %q in %s", field, r.Name, r.Path)
	case r.DType != "" && info.DType != r.DType:
		err = workerkit.InvalidArgumentf("%s: tensor is %s, the request says %s", field, info.DType, r.DType)
	case len(r.Shape) > 0 && !slices.Equal(info.Shape, r.Shape):
		err = workerkit.InvalidArgumentf("%s: tensor has shape %v, the request says shape %v", field, info.Shape, r.Shape)
	}
	if err != nil {
		f.Close()
		return nil, info, err
	}
	return f, info, nil
}

// ReadFloat reads the float tensor r names, of the given rank, as float32 values and its shape.
func ReadFloat(field string, r workerkit.TensorRef, rank int) ([]float32, []int64, error) {
	f, info, err := Open(field, r)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if !info.DType.IsFloat() || len(info.Shape) != rank {
		return nil, nil, workerkit.InvalidArgumentf("%s: %s%v, want a rank-%d float tensor", field, info.DType, info.Shape, rank)
	}
	v, shape, err := f.Float32(r.Name)
	if err != nil {
		return nil, nil, workerkit.InvalidArgumentf("%s: %v", field, err)
	}
	return v, shape, nil
}

// Output is one tensor a stage writes.
type Output struct {
	// Field is the request field that names it ("latents"), for errors.
	Field string
	// Ref is where it goes; a shape it states must be Shape.
	Ref workerkit.TensorRef
	// DType is what it is written as; empty means a float output in FloatDType(Ref).
	DType safetensors.DType
	// Shape is the tensor's shape.
	Shape []int64
}

// Outputs are a stage's output segments, open for writing: outputs that share a path share a
// file, written as "<path>.partial" and renamed by Commit. A stage that fails calls Abort.
type Outputs struct {
	outs    []Output
	writers map[string]*shm.Writer
	paths   []string // in first-use order
}

// Create checks the outputs' references (CheckRef, dtype, the shape a reference asks for, no
// tensor named twice) and creates their segments, memory reserved up front, so a full
// /dev/shm fails here rather than halfway through writing.
func Create(outs []Output) (*Outputs, error) {
	o := &Outputs{outs: slices.Clone(outs), writers: map[string]*shm.Writer{}}
	specs := map[string][]shm.TensorSpec{}
	fields := map[string]string{} // path and name → field
	for i := range o.outs {
		out := &o.outs[i]
		if err := CheckRef(out.Field, out.Ref); err != nil {
			return nil, err
		}
		if out.DType == "" {
			dt, err := FloatDType(out.Field, out.Ref)
			if err != nil {
				return nil, err
			}
			out.DType = dt
		}
		if err := CheckShape(out.Field, out.Ref, out.Shape); err != nil {
			return nil, err
		}
		key := out.Ref.Path + "\x00" + out.Ref.Name
		if prev, ok := fields[key]; ok {
			return nil, workerkit.InvalidArgumentf("%s and %s both name tensor %q of %s", prev, out.Field, out.Ref.Name, out.Ref.Path)
		}
		fields[key] = out.Field
		if _, ok := specs[out.Ref.Path]; !ok {
			o.paths = append(o.paths, out.Ref.Path)
		}
		specs[out.Ref.Path] = append(specs[out.Ref.Path], shm.TensorSpec{Name: out.Ref.Name, DType: out.DType, Shape: out.Shape})
	}
	for _, p := range o.paths {
		w, err := shm.Create(p, specs[p])
		if err != nil {
			o.Abort()
			return nil, fmt.Errorf("create output: %w", err)
		}
		o.writers[p] = w
	}
	return o, nil
}

// Target returns output i's data in its segment's own mapping, to compute into, when it is
// F32 (ok); otherwise the stage computes elsewhere and calls PutFloat.
func (o *Outputs) Target(i int) (v []float32, ok bool, err error) {
	out := o.outs[i]
	if out.DType != safetensors.F32 {
		return nil, false, nil
	}
	b, err := o.writers[out.Ref.Path].Bytes(out.Ref.Name)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", out.Field, err)
	}
	// Segment data starts on a page boundary and tensors are aligned in it; the host is
	// little-endian like the file.
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4), true, nil
}

// PutFloat writes v as output i, converted to its dtype.
func (o *Outputs) PutFloat(i int, v []float32) error {
	data, err := EncodeFloat(o.outs[i].DType, v)
	if err != nil {
		return fmt.Errorf("%s: %w", o.outs[i].Field, err)
	}
	return o.Put(i, data)
}

// Put writes output i's data, already encoded in its dtype.
func (o *Outputs) Put(i int, data []byte) error {
	out := o.outs[i]
	if err := o.writers[out.Ref.Path].Write(out.Ref.Name, data); err != nil {
		return fmt.Errorf("%s: %w", out.Field, err)
	}
	return nil
}

// Commit renames every segment into place and returns the written references, in order.
func (o *Outputs) Commit() ([]workerkit.TensorRef, error) {
	for _, p := range o.paths {
		if _, err := o.writers[p].Commit(); err != nil {
			o.Abort()
			return nil, fmt.Errorf("commit output: %w", err)
		}
		delete(o.writers, p)
	}
	refs := make([]workerkit.TensorRef, len(o.outs))
	for i, out := range o.outs {
		refs[i] = workerkit.TensorRef{Path: out.Ref.Path, Name: out.Ref.Name, DType: out.DType, Shape: slices.Clone(out.Shape)}
	}
	return refs, nil
}

// Abort removes the partial files not committed.
func (o *Outputs) Abort() {
	for p, w := range o.writers {
		w.Abort()
		delete(o.writers, p)
	}
}

// Write writes outputs whose data is ready (data[i] encoded in outs[i]'s dtype) and returns
// the written references.
func Write(outs []Output, data [][]byte) ([]workerkit.TensorRef, error) {
	o, err := Create(outs)
	if err != nil {
		return nil, err
	}
	for i := range outs {
		if err := o.Put(i, data[i]); err != nil {
			o.Abort()
			return nil, err
		}
	}
	return o.Commit()
}

// WriteFloat writes v, of the given shape, as the one float output field names at r (in the
// dtype r asks for) and returns the reference as written.
func WriteFloat(field string, r workerkit.TensorRef, v []float32, shape []int64) (workerkit.TensorRef, error) {
	o, err := Create([]Output{{Field: field, Ref: r, Shape: shape}})
	if err != nil {
		return workerkit.TensorRef{}, err
	}
	if err := o.PutFloat(0, v); err != nil {
		o.Abort()
		return workerkit.TensorRef{}, err
	}
	refs, err := o.Commit()
	if err != nil {
		return workerkit.TensorRef{}, err
	}
	return refs[0], nil
}
