package safetensors

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// File is a safetensors file mapped into memory read-only. Byte slices it returns stay valid
// until Close.
type File struct {
	path   string
	header *Header
	data   []byte // the whole mapping (nil for an empty file)
}

// Open maps path and validates its header.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("open %s: %w: not a regular file", path, ErrInvalid)
	}
	size := st.Size()
	h, err := ReadHeader(f, size)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var data []byte
	if size > 0 {
		data, err = unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("mmap %s: %w", path, err)
		}
	}
	return &File{path: path, header: h, data: data}, nil
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Header returns the validated header.
func (f *File) Header() *Header { return f.header }

// Names returns the tensor names in data order.
func (f *File) Names() []string {
	out := make([]string, len(f.header.Tensors))
	for i, t := range f.header.Tensors {
		out[i] = t.Name
	}
	return out
}

// Metadata returns the "__metadata__" map (nil when absent).
func (f *File) Metadata() map[string]string { return f.header.Metadata }

// Info returns the description of tensor name.
func (f *File) Info(name string) (TensorInfo, bool) { return f.header.Lookup(name) }

// Bytes returns the raw little-endian data of tensor name, a view into the mapping.
func (f *File) Bytes(name string) ([]byte, error) {
	t, ok := f.header.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", f.path, name)
	}
	if f.data == nil {
		return nil, fmt.Errorf("%s: closed", f.path)
	}
	s := f.header.DataStart
	return f.data[s+t.Begin : s+t.End : s+t.End], nil
}

// Float32 returns tensor name converted to float32 (a fresh copy) and its shape.
func (f *File) Float32(name string) ([]float32, []int64, error) {
	t, raw, err := f.info(name)
	if err != nil {
		return nil, nil, err
	}
	out := make([]float32, t.NumElements())
	if err := decodeFloat32(out, raw, t.DType); err != nil {
		return nil, nil, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
	}
	return out, t.Shape, nil
}

// Int64 returns an integer or boolean tensor as int64 values and its shape.
func (f *File) Int64(name string) ([]int64, []int64, error) {
	t, raw, err := f.info(name)
	if err != nil {
		return nil, nil, err
	}
	out := make([]int64, t.NumElements())
	if err := decodeInt64(out, raw, t.DType); err != nil {
		return nil, nil, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
	}
	return out, t.Shape, nil
}

func (f *File) info(name string) (TensorInfo, []byte, error) {
	raw, err := f.Bytes(name)
	if err != nil {
		return TensorInfo{}, nil, err
	}
	t, _ := f.header.Lookup(name)
	return t, raw, nil
}

// Release drops the pages of tensor name from this process's resident memory: the mapping is
// shared and read-only, so the file's pages stay in the page cache and a later read of the
// tensor faults them back in. A loader that has copied a tensor (to the device or into a host
// copy) releases it, so the process's resident size counts each weight once, not twice (the
// copy and the mapping) while the rest of the checkpoint loads. It never changes what a view
// reads, even one still in use: the mapping is file-backed, so a dropped page is read back from
// the page cache (or the file) on its next touch. Only pages wholly inside the tensor are
// dropped; a closed file or unknown name is a no-op.
func (f *File) Release(name string) {
	t, ok := f.header.Lookup(name)
	if !ok || f.data == nil {
		return
	}
	page := int64(os.Getpagesize())
	s := f.header.DataStart
	begin := (s + t.Begin + page - 1) / page * page
	end := (s + t.End) / page * page
	if end > begin {
		_ = unix.Madvise(f.data[begin:end], unix.MADV_DONTNEED) // advice only: a refusal changes nothing
	}
}

// Close unmaps the file. Slices returned by Bytes must not be used afterwards.
func (f *File) Close() error {
	if f.data == nil {
		return nil
	}
	err := unix.Munmap(f.data)
	f.data = nil
	if err != nil {
		return fmt.Errorf("munmap %s: %w", f.path, err)
	}
	return nil
}
