package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
)

// Tensor is one tensor to write: raw little-endian data of the given dtype and shape.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
}

// FromFloat32 makes an F32 tensor from values.
func FromFloat32(name string, shape []int64, values []float32) Tensor {
	b := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return Tensor{Name: name, DType: F32, Shape: shape, Data: b}
}

// FromInt64 makes an I64 tensor from values.
func FromInt64(name string, shape []int64, values []int64) Tensor {
	b := make([]byte, 8*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return Tensor{Name: name, DType: I64, Shape: shape, Data: b}
}

// FromUint8 makes a U8 tensor from values (the slice is used as is).
func FromUint8(name string, shape []int64, values []byte) Tensor {
	return Tensor{Name: name, DType: U8, Shape: shape, Data: values}
}

// WriteOptions controls how a file is laid out.
type WriteOptions struct {
	// Align pads the header with spaces so the data section starts at a multiple of Align
	// bytes from the file start (4096 for shared-memory segments and GPU DMA); 0 or 1 means 8,
	// the format's own alignment.
	Align int
	// Metadata is stored as "__metadata__".
	Metadata map[string]string
}

type headerEntry struct {
	DType       DType    `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// EncodeHeader returns the 8-byte length plus the padded JSON header for tensors, and the data
// offsets each tensor will have (in the order given).
func EncodeHeader(tensors []Tensor, opts WriteOptions) ([]byte, error) {
	infos := make([]TensorInfo, len(tensors))
	for i, t := range tensors {
		infos[i] = TensorInfo{Name: t.Name, DType: t.DType, Shape: t.Shape}
		if !t.DType.Valid() {
			continue // EncodeLayout names it (and a negative dimension)
		}
		n, neg := int64(1), false
		for _, d := range t.Shape {
			n *= d
			neg = neg || d < 0
		}
		if !neg && int64(len(t.Data)) != n*int64(t.DType.Size()) {
			return nil, fmt.Errorf("tensor %q: %d bytes of data for shape %v of %s, expected %d", t.Name, len(t.Data), t.Shape, t.DType, n*int64(t.DType.Size()))
		}
	}
	return EncodeLayout(infos, opts)
}

// EncodeLayout returns the 8-byte length plus the padded JSON header of a file whose tensors'
// data follow in the order given, each taking its shape times its dtype's size (Begin and End
// are ignored): a header for data written separately, as large checkpoints are.
func EncodeLayout(tensors []TensorInfo, opts WriteOptions) ([]byte, error) {
	entries := make(map[string]any, len(tensors)+1)
	var off int64
	for _, t := range tensors {
		if !t.DType.Valid() {
			return nil, fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		if t.Name == "__metadata__" {
			return nil, fmt.Errorf("tensor name __metadata__ is reserved")
		}
		if _, dup := entries[t.Name]; dup {
			return nil, fmt.Errorf("tensor %q given twice", t.Name)
		}
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension in %v", t.Name, t.Shape)
			}
			n *= d
		}
		shape := t.Shape
		if shape == nil {
			shape = []int64{}
		}
		size := n * int64(t.DType.Size())
		entries[t.Name] = headerEntry{DType: t.DType, Shape: shape, DataOffsets: [2]int64{off, off + size}}
		off += size
	}
	if opts.Metadata != nil {
		entries["__metadata__"] = opts.Metadata
	}
	js, err := json.Marshal(entries)
	if err != nil {
		return nil, fmt.Errorf("encode header: %w", err)
	}
	align := opts.Align
	if align < 8 {
		align = 8
	}
	total := 8 + len(js)
	if rem := total % align; rem != 0 {
		total += align - rem
	}
	buf := make([]byte, total)
	binary.LittleEndian.PutUint64(buf, uint64(total-8))
	copy(buf[8:], js)
	for i := 8 + len(js); i < total; i++ {
		buf[i] = ' '
	}
	return buf, nil
}

// Encode writes a complete safetensors file to w.
func Encode(w io.Writer, tensors []Tensor, opts WriteOptions) error {
	hdr, err := EncodeHeader(tensors, opts)
	if err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("write header: %w", err)
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return fmt.Errorf("write tensor %q: %w", t.Name, err)
		}
	}
	return nil
}

// WriteFile writes tensors to path atomically: the data goes to path+".partial" with mode 0600,
// is synced, and is renamed over path only when complete. On error nothing is left behind.
func WriteFile(path string, tensors []Tensor, opts WriteOptions) (err error) {
	tmp := path + ".partial"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err = Encode(bw, tensors, opts); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", filepath.Base(tmp), err)
	}
	return nil
}
