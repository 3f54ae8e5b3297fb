package runtime

/*
#include "fpk.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// Tensor is a contiguous n-d array in a runtime's backend memory. Free it when done (or let a
// Scope do it); using it after Free fails with ErrFreed. A Tensor is safe to read from several
// goroutines; Free must not race with its use.
type Tensor struct {
	rt    *Runtime
	shape []int
	dtype DType

	// mu protects h.
	mu sync.Mutex
	h  C.fpk_tensor_t
}

// Shape returns a copy of the tensor's dims.
func (t *Tensor) Shape() []int { return slices.Clone(t.shape) }

// Dim returns dim i; negative i counts from the end (-1 is the last).
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.shape)
	}
	if i < 0 || i >= len(t.shape) {
		return 0
	}
	return t.shape[i]
}

// Rank returns the number of dims.
func (t *Tensor) Rank() int { return len(t.shape) }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// NumElements returns the number of elements (1 for a scalar).
func (t *Tensor) NumElements() int { return numel(t.shape) }

// NumBytes returns the size of the data in bytes.
func (t *Tensor) NumBytes() int { return t.NumElements() * t.dtype.Size() }

// Runtime returns the runtime that owns the tensor.
func (t *Tensor) Runtime() *Runtime { return t.rt }

// String describes the tensor ("f32[2 3 4]").
func (t *Tensor) String() string {
	if t == nil {
		return "<nil tensor>"
	}
	return fmt.Sprintf("%s%v", t.dtype, t.shape)
}

// Free releases the tensor's handle (its memory goes when the last handle sharing it — see
// Reshape — is freed). Free is idempotent and nil-safe.
func (t *Tensor) Free() {
	if t == nil {
		return
	}
	t.mu.Lock()
	h := t.h
	t.h = nil
	t.mu.Unlock()
	if h != nil {
		C.fpk_tensor_free(h)
	}
}

// handle returns the live handle or ErrFreed.
func (t *Tensor) handle(op string) (C.fpk_tensor_t, error) {
	if t == nil {
		return nil, argError(op, "nil tensor")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.h == nil {
		return nil, fmt.Errorf("%s: %s: %w", op, t, ErrFreed)
	}
	return t.h, nil
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func cShape(shape []int) ([]C.int64_t, *C.int64_t) {
	if len(shape) == 0 {
		return nil, nil
	}
	s := make([]C.int64_t, len(shape))
	for i, d := range shape {
		s[i] = C.int64_t(d)
	}
	return s, &s[0]
}

// maxDims is the most dims a tensor may have (FPK_MAX_DIMS).
const maxDims = C.FPK_MAX_DIMS

func checkShape(op string, shape []int) error {
	if len(shape) > maxDims {
		return argError(op, "%d dims (at most %d)", len(shape), maxDims)
	}
	for i, d := range shape {
		if d < 0 {
			return argError(op, "negative dim %d in %v", i, shape)
		}
	}
	return nil
}

// NewTensor allocates a tensor with undefined contents (NaN with Options.Poison).
func (rt *Runtime) NewTensor(dt DType, shape ...int) (*Tensor, error) {
	return rt.newTensor("new tensor", dt, shape)
}

func (rt *Runtime) newTensor(op string, dt DType, shape []int) (*Tensor, error) {
	if err := checkShape(op, shape); err != nil {
		return nil, err
	}
	if dt.Size() == 0 {
		return nil, argError(op, "unknown dtype %d", int(dt))
	}
	cs, cp := cShape(shape)
	var h C.fpk_tensor_t
	err := rt.withBackend(op, func() C.fpk_status {
		return C.fpk_tensor_new(rt.be, C.fpk_dtype(dt), C.int(len(cs)), cp, &h)
	})
	if err != nil {
		return nil, err
	}
	return &Tensor{rt: rt, h: h, shape: slices.Clone(shape), dtype: dt}, nil
}

// Full allocates a tensor with every element set to value.
func (rt *Runtime) Full(dt DType, value float64, shape ...int) (*Tensor, error) {
	t, err := rt.newTensor("full", dt, shape)
	if err != nil {
		return nil, err
	}
	if err := t.Fill(value); err != nil {
		t.Free()
		return nil, err
	}
	return t, nil
}

// Zeros allocates a tensor of zeros.
func (rt *Runtime) Zeros(dt DType, shape ...int) (*Tensor, error) { return rt.Full(dt, 0, shape...) }

// Fill sets every element to value (converted to the tensor's dtype).
func (t *Tensor) Fill(value float64) error {
	h, err := t.handle("fill")
	if err != nil {
		return err
	}
	return t.rt.run("fill", nil, func() C.fpk_status { return C.fpk_tensor_fill(t.rt.stream, h, C.double(value)) })
}

// FromFloat32 creates an f32 tensor holding data (len(data) must equal the shape's size).
func (rt *Runtime) FromFloat32(data []float32, shape ...int) (*Tensor, error) {
	return rt.fromHost("from float32", F32, F32, unsafe.Pointer(unsafe.SliceData(data)), len(data), shape)
}

// FromFloat32As creates a tensor of float dtype dt holding data rounded to it (a model's input
// in its activation dtype; F32 is FromFloat32).
func (rt *Runtime) FromFloat32As(dt DType, data []float32, shape ...int) (*Tensor, error) {
	if !dt.IsFloat() {
		return nil, argError("from float32", "dtype %s is not a float dtype", dt)
	}
	return rt.fromHost("from float32", dt, F32, unsafe.Pointer(unsafe.SliceData(data)), len(data), shape)
}

// FromInt32 creates an i32 tensor (token ids) holding data.
func (rt *Runtime) FromInt32(data []int32, shape ...int) (*Tensor, error) {
	return rt.fromHost("from int32", I32, I32, unsafe.Pointer(unsafe.SliceData(data)), len(data), shape)
}

// FromUint8 creates a u8 tensor (a boolean mask: nonzero = keep) holding data.
func (rt *Runtime) FromUint8(data []uint8, shape ...int) (*Tensor, error) {
	return rt.fromHost("from uint8", U8, U8, unsafe.Pointer(unsafe.SliceData(data)), len(data), shape)
}

// FromBytes creates a tensor of dtype dt from raw little-endian data of dtype src, converting
// on upload (e.g. bf16 checkpoint bytes into an f32 tensor).
func (rt *Runtime) FromBytes(dt, src DType, raw []byte, shape ...int) (*Tensor, error) {
	if src.Size() == 0 {
		return nil, argError("from bytes", "unknown source dtype %d", int(src))
	}
	if len(raw)%src.Size() != 0 {
		return nil, argError("from bytes", "%d bytes is not a whole number of %s elements", len(raw), src)
	}
	return rt.fromHost("from bytes", dt, src, unsafe.Pointer(unsafe.SliceData(raw)), len(raw)/src.Size(), shape)
}

func (rt *Runtime) fromHost(op string, dt, src DType, p unsafe.Pointer, n int, shape []int) (*Tensor, error) {
	if err := checkShape(op, shape); err != nil {
		return nil, err
	}
	if n != numel(shape) {
		return nil, argError(op, "%d elements for shape %v (%d elements)", n, shape, numel(shape))
	}
	t, err := rt.newTensor(op, dt, shape)
	if err != nil {
		return nil, err
	}
	if err := t.upload(op, src, p, n*src.Size()); err != nil {
		t.Free()
		return nil, err
	}
	return t, nil
}

// TensorSource is a set of named tensors in safetensors form: *safetensors.File and
// *safetensors.Checkpoint.
type TensorSource interface {
	Info(name string) (safetensors.TensorInfo, bool)
	Bytes(name string) ([]byte, error)
}

// LoadTensor uploads the named tensor of src into a new tensor of dtype dt, converting once
// (f16/bf16/f32 exactly to f32; f64 and i64 are converted on the Go side first). dt AsStored
// keeps the source's dtype (F64 as F32, I64 as I32).
func (rt *Runtime) LoadTensor(src TensorSource, name string, dt DType) (*Tensor, error) {
	op := "load tensor " + name
	info, ok := src.Info(name)
	if !ok {
		return nil, argError(op, "no such tensor")
	}
	if dt == AsStored {
		dt = StoredDType(info.DType)
	}
	raw, err := src.Bytes(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	shape := make([]int, len(info.Shape))
	for i, d := range info.Shape {
		if d < 0 || d > math.MaxInt32*int64(64) {
			return nil, argError(op, "dim %d of %v", i, info.Shape)
		}
		shape[i] = int(d)
	}
	sdt, ok := DTypeOf(info.DType)
	switch {
	case ok:
		return rt.FromBytes(dt, sdt, raw, shape...)
	case info.DType == safetensors.F64:
		f := make([]float32, len(raw)/8)
		for i := range f {
			f[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
		}
		return rt.fromHost(op, dt, F32, unsafe.Pointer(unsafe.SliceData(f)), len(f), shape)
	case info.DType == safetensors.I64:
		v := make([]int32, len(raw)/8)
		for i := range v {
			x := int64(binary.LittleEndian.Uint64(raw[8*i:]))
			if x < math.MinInt32 || x > math.MaxInt32 {
				return nil, argError(op, "i64 value %d at %d does not fit i32", x, i)
			}
			v[i] = int32(x)
		}
		return rt.fromHost(op, dt, I32, unsafe.Pointer(unsafe.SliceData(v)), len(v), shape)
	}
	return nil, argError(op, "dtype %s is not supported", info.DType)
}

// Upload copies raw little-endian data of dtype src into the tensor, converting to its dtype.
func (t *Tensor) Upload(src DType, raw []byte) error {
	if src.Size() == 0 || len(raw)%src.Size() != 0 {
		return argError("upload", "%d bytes of dtype %s", len(raw), src)
	}
	return t.upload("upload", src, unsafe.Pointer(unsafe.SliceData(raw)), len(raw))
}

// UploadFloat32 copies data into the tensor, converting to its dtype.
func (t *Tensor) UploadFloat32(data []float32) error {
	return t.upload("upload", F32, unsafe.Pointer(unsafe.SliceData(data)), 4*len(data))
}

func (t *Tensor) upload(op string, src DType, p unsafe.Pointer, nbytes int) error {
	h, err := t.handle(op)
	if err != nil {
		return err
	}
	return t.rt.withBackend(op, func() C.fpk_status {
		return C.fpk_tensor_upload(t.rt.stream, h, C.fpk_dtype(src), p, C.size_t(nbytes))
	})
}

// Download copies the tensor into dst as raw little-endian data of dtype dt (len(dst) must be
// NumElements × dt.Size()), converting from the tensor's dtype.
func (t *Tensor) Download(dt DType, dst []byte) error {
	return t.download("download", dt, unsafe.Pointer(unsafe.SliceData(dst)), len(dst))
}

// Float32 downloads the tensor as float32 values. A 16-bit tensor on a device is widened there
// first (exact), so the download is one copy of f32 bytes: the core's own conversion stages the
// 16-bit data through host memory and widens it on one host thread, tens of milliseconds for a
// full-size VAE tile with the device idle. Where the f32 copy does not fit (a tight cap), the
// core's path serves.
func (t *Tensor) Float32() ([]float32, error) {
	src := t
	if (t.dtype == F16 || t.dtype == BF16) && t.rt != nil && !t.rt.Backend().IsHost {
		if wide, err := t.rt.Cast(t, F32); err == nil {
			defer wide.Free()
			src = wide
		}
	}
	out := make([]float32, t.NumElements())
	if err := src.download("download", F32, unsafe.Pointer(unsafe.SliceData(out)), 4*len(out)); err != nil {
		return nil, err
	}
	return out, nil
}

// Int32 downloads the tensor as int32 values.
func (t *Tensor) Int32() ([]int32, error) {
	out := make([]int32, t.NumElements())
	if err := t.download("download", I32, unsafe.Pointer(unsafe.SliceData(out)), 4*len(out)); err != nil {
		return nil, err
	}
	return out, nil
}

// Bytes downloads the tensor's data as stored (its own dtype).
func (t *Tensor) Bytes() ([]byte, error) {
	out := make([]byte, t.NumBytes())
	if err := t.download("download", t.dtype, unsafe.Pointer(unsafe.SliceData(out)), len(out)); err != nil {
		return nil, err
	}
	return out, nil
}

func (t *Tensor) download(op string, dt DType, p unsafe.Pointer, nbytes int) error {
	h, err := t.handle(op)
	if err != nil {
		return err
	}
	if dt.Size() == 0 {
		return argError(op, "unknown dtype %d", int(dt))
	}
	return t.rt.withBackend(op, func() C.fpk_status {
		return C.fpk_tensor_download(t.rt.stream, h, C.fpk_dtype(dt), p, C.size_t(nbytes))
	})
}

// Reshape returns a new handle on the same storage with another shape of the same size; one
// dim may be -1 (inferred). Both handles must be freed; the storage goes with the last.
func (t *Tensor) Reshape(shape ...int) (*Tensor, error) {
	const op = "reshape"
	h, err := t.handle(op)
	if err != nil {
		return nil, err
	}
	shape, err = inferShape(op, shape, t.NumElements())
	if err != nil {
		return nil, err
	}
	cs, cp := cShape(shape)
	var out C.fpk_tensor_t
	if err := t.rt.withBackend(op, func() C.fpk_status {
		return C.fpk_tensor_reshape(h, C.int(len(cs)), cp, &out)
	}); err != nil {
		return nil, err
	}
	return &Tensor{rt: t.rt, h: out, shape: shape, dtype: t.dtype}, nil
}

func inferShape(op string, shape []int, n int) ([]int, error) {
	shape = slices.Clone(shape)
	infer, known := -1, 1
	for i, d := range shape {
		switch {
		case d == -1 && infer < 0:
			infer = i
		case d < 0:
			return nil, argError(op, "bad dim %d in %v", d, shape)
		default:
			known *= d
		}
	}
	if infer >= 0 {
		if known == 0 || n%known != 0 {
			return nil, argError(op, "cannot infer -1 in %v for %d elements", shape, n)
		}
		shape[infer] = n / known
	}
	if numel(shape) != n {
		return nil, argError(op, "shape %v has %d elements, tensor has %d", shape, numel(shape), n)
	}
	return shape, checkShape(op, shape)
}
