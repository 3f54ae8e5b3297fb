package shm

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// Align is the boundary, in bytes, at which a segment's tensor data starts. Page alignment lets
// GPU backends pin the mapping for DMA.
const Align = 4096

// More typed errors that callers act on.
var (
	// ErrIncomplete is returned when asked to read a segment that has not been committed: a
	// "*.partial" path, or a path whose writer has not renamed the file yet.
	ErrIncomplete = errors.New("shm: segment incomplete")
	// ErrMisaligned is returned for a safetensors file whose data does not start on an Align
	// boundary, i.e. one not written as a segment.
	ErrMisaligned = errors.New("shm: segment data not page-aligned")
)

// TensorSpec describes one tensor of a segment: its name, element type and shape.
type TensorSpec struct {
	Name  string
	DType safetensors.DType
	Shape []int64
}

// Bytes returns the size of the tensor's data.
func (s TensorSpec) Bytes() int64 {
	n := int64(s.DType.Size())
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

// Segment names a complete segment file and the tensors in it.
type Segment struct {
	Path    string
	Tensors []TensorSpec
}

// Tensor returns the spec of the named tensor.
func (s Segment) Tensor(name string) (TensorSpec, bool) {
	for _, t := range s.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorSpec{}, false
}

// layout is a segment's header and the data offsets of its tensors, in spec order.
type layout struct {
	header []byte  // length prefix + JSON + padding; len is a multiple of Align
	begin  []int64 // data offset of each tensor, relative to the data start
	data   int64   // total data bytes
}

// headerEntry is one tensor's entry in a safetensors JSON header.
type headerEntry struct {
	DType       safetensors.DType `json:"dtype"`
	Shape       []int64           `json:"shape"`
	DataOffsets [2]int64          `json:"data_offsets"`
}

// planLayout checks specs and builds the header that places their data, in order, after an
// Align-padded header. (safetensors.EncodeHeader needs the data in memory; a segment is sized
// before its data exists.)
func planLayout(specs []TensorSpec, metadata map[string]string) (layout, error) {
	entries := make(map[string]any, len(specs)+1)
	l := layout{begin: make([]int64, len(specs))}
	for i, s := range specs {
		if s.Name == "" || s.Name == "__metadata__" {
			return layout{}, fmt.Errorf("tensor name %q not allowed", s.Name)
		}
		if !s.DType.Valid() {
			return layout{}, fmt.Errorf("tensor %q: unknown dtype %q", s.Name, s.DType)
		}
		if _, dup := entries[s.Name]; dup {
			return layout{}, fmt.Errorf("tensor %q given twice", s.Name)
		}
		n := int64(s.DType.Size())
		for _, d := range s.Shape {
			if d < 0 {
				return layout{}, fmt.Errorf("tensor %q: negative dimension in %v", s.Name, s.Shape)
			}
			if d != 0 && n > math.MaxInt64/4/d {
				return layout{}, fmt.Errorf("tensor %q: shape %v too large", s.Name, s.Shape)
			}
			n *= d
		}
		if l.data > math.MaxInt64/4-n {
			return layout{}, fmt.Errorf("tensor %q: segment too large", s.Name)
		}
		shape := s.Shape
		if shape == nil {
			shape = []int64{}
		}
		l.begin[i] = l.data
		entries[s.Name] = headerEntry{DType: s.DType, Shape: shape, DataOffsets: [2]int64{l.data, l.data + n}}
		l.data += n
	}
	if metadata != nil {
		entries["__metadata__"] = metadata
	}
	js, err := json.Marshal(entries)
	if err != nil {
		return layout{}, fmt.Errorf("encode header: %w", err)
	}
	total := (8 + len(js) + Align - 1) / Align * Align
	l.header = make([]byte, total)
	binary.LittleEndian.PutUint64(l.header, uint64(total-8))
	copy(l.header[8:], js)
	for i := 8 + len(js); i < total; i++ {
		l.header[i] = ' '
	}
	return l, nil
}

// Writer fills one segment's "*.partial" file; Commit makes it visible under its final path.
// Tensors are written with Write/WriteAt (pwrite: the fastest way to move bytes that are already
// in memory) or filled in place through Bytes (a shared mapping: for producers that compute into
// the segment directly, or a GPU backend that pins it for DMA). A Writer is used by one goroutine
// at a time; the byte slices from Bytes may be filled concurrently.
type Writer struct {
	path  string
	specs []TensorSpec
	l     layout
	f     *os.File // nil once finished
	mem   []byte   // whole-file mapping, made on the first Bytes call
}

// Create prepares "<path>.partial" for specs and returns a Writer for it. The file's memory is
// reserved up front (fallocate), so a full /dev/shm is an error here rather than a crash while
// filling a mapping. A partial file already laid out for exactly these specs (see Preallocate)
// is reused as it is, without being cleared.
func Create(path string, specs []TensorSpec) (*Writer, error) {
	return CreateWithMetadata(path, specs, nil)
}

// CreateWithMetadata is Create with a "__metadata__" string map in the header.
func CreateWithMetadata(path string, specs []TensorSpec, metadata map[string]string) (*Writer, error) {
	if strings.HasSuffix(path, PartialExt) {
		return nil, fmt.Errorf("create segment %s: %w: give the final path", path, ErrInvalidName)
	}
	l, err := planLayout(specs, metadata)
	if err != nil {
		return nil, fmt.Errorf("create segment %s: %w", path, err)
	}
	tmp := path + PartialExt
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	size := int64(len(l.header)) + l.data
	if !laidOut(f, l.header, size) {
		fail := func(err error) (*Writer, error) {
			f.Close()
			os.Remove(tmp)
			return nil, fmt.Errorf("create segment %s: %w", path, err)
		}
		if err := f.Truncate(0); err != nil {
			return fail(err)
		}
		if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
			if !errors.Is(err, unix.EOPNOTSUPP) {
				return fail(fmt.Errorf("reserve %d bytes: %w", size, err))
			}
			if err := f.Truncate(size); err != nil { // filesystems without fallocate
				return fail(err)
			}
		}
		if _, err := f.WriteAt(l.header, 0); err != nil {
			return fail(fmt.Errorf("write header: %w", err))
		}
	}
	own := make([]TensorSpec, len(specs))
	for i, s := range specs {
		own[i] = TensorSpec{Name: s.Name, DType: s.DType, Shape: cloneShape(s.Shape)}
	}
	return &Writer{path: path, specs: own, l: l, f: f}, nil
}

// laidOut reports whether f already has size bytes and starts with header.
func laidOut(f *os.File, header []byte, size int64) bool {
	st, err := f.Stat()
	if err != nil || st.Size() != size {
		return false
	}
	got := make([]byte, len(header))
	n, _ := f.ReadAt(got, 0)
	return n == len(header) && string(got) == string(header)
}

// Preallocate lays out "<path>.partial" for specs (header written, memory reserved) and leaves
// it for a later Create with the same specs, typically in the worker that fills it. The
// supervisor calls it while the producing stage is still computing, so allocating the memory is
// off the critical path.
func Preallocate(path string, specs []TensorSpec) error {
	w, err := Create(path, specs)
	if err != nil {
		return fmt.Errorf("preallocate: %w", err)
	}
	err = w.f.Close()
	w.f = nil
	if err != nil {
		os.Remove(path + PartialExt)
		return fmt.Errorf("preallocate %s: %w", path, err)
	}
	return nil
}

// Path returns the segment's final path.
func (w *Writer) Path() string { return w.path }

// span returns the file offset and size of the named tensor's data.
func (w *Writer) span(name string) (off, size int64, err error) {
	if w.f == nil {
		return 0, 0, fmt.Errorf("segment %s: writer finished", w.path)
	}
	for i, s := range w.specs {
		if s.Name == name {
			return int64(len(w.l.header)) + w.l.begin[i], s.Bytes(), nil
		}
	}
	return 0, 0, fmt.Errorf("segment %s: no tensor %q", w.path, name)
}

// Write writes the whole data of the named tensor; data must be exactly the tensor's size.
func (w *Writer) Write(name string, data []byte) error {
	_, size, err := w.span(name)
	if err != nil {
		return err
	}
	if int64(len(data)) != size {
		return fmt.Errorf("segment %s: tensor %q: %d bytes given, %d expected", w.path, name, len(data), size)
	}
	return w.WriteAt(name, data, 0)
}

// WriteAt writes p at byte offset off within the named tensor's data, for producers that emit a
// tensor in pieces.
func (w *Writer) WriteAt(name string, p []byte, off int64) error {
	base, size, err := w.span(name)
	if err != nil {
		return err
	}
	if off < 0 || off > size || int64(len(p)) > size-off {
		return fmt.Errorf("segment %s: tensor %q: write [%d,%d) outside its %d bytes", w.path, name, off, off+int64(len(p)), size)
	}
	if _, err := w.f.WriteAt(p, base+off); err != nil {
		return fmt.Errorf("segment %s: tensor %q: %w", w.path, name, err)
	}
	return nil
}

// Bytes returns the named tensor's data as a writable slice of a shared mapping of the file,
// valid until Commit or Abort.
func (w *Writer) Bytes(name string) ([]byte, error) {
	off, size, err := w.span(name)
	if err != nil {
		return nil, err
	}
	if w.mem == nil {
		total := int64(len(w.l.header)) + w.l.data
		mem, err := unix.Mmap(int(w.f.Fd()), 0, int(total), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("segment %s: mmap: %w", w.path, err)
		}
		// Map every page writable in one call rather than one fault per page (Linux 5.14+;
		// older kernels fault them in as they are written).
		_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
		w.mem = mem
	}
	return w.mem[off : off+size : off+size], nil
}

// release unmaps and closes the file.
func (w *Writer) release() error {
	var err error
	if w.mem != nil {
		err = unix.Munmap(w.mem)
		w.mem = nil
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	return err
}

// Commit closes the file and renames it from "*.partial" to its final path, replacing any older
// file there (readers that map the old one keep it). It returns the segment's description.
func (w *Writer) Commit() (Segment, error) {
	if w.f == nil {
		return Segment{}, fmt.Errorf("commit segment %s: writer finished", w.path)
	}
	err := w.release()
	if err == nil {
		err = os.Rename(w.path+PartialExt, w.path)
	}
	if err != nil {
		os.Remove(w.path + PartialExt)
		return Segment{}, fmt.Errorf("commit segment %s: %w", w.path, err)
	}
	return Segment{Path: w.path, Tensors: w.specs}, nil
}

// Abort closes and removes the partial file. It does nothing after Commit.
func (w *Writer) Abort() error {
	if w.f == nil {
		return nil
	}
	err := w.release()
	if rerr := os.Remove(w.path + PartialExt); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("abort segment %s: %w", w.path, err)
	}
	return nil
}

// WriteSegment writes in-memory tensors as a segment at path ("*.partial", then renamed).
func WriteSegment(path string, tensors []safetensors.Tensor) (Segment, error) {
	specs := make([]TensorSpec, len(tensors))
	for i, t := range tensors {
		specs[i] = TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
		if int64(len(t.Data)) != specs[i].Bytes() || !t.DType.Valid() {
			return Segment{}, fmt.Errorf("write segment %s: tensor %q: %d bytes for shape %v of %s", path, t.Name, len(t.Data), t.Shape, t.DType)
		}
	}
	w, err := Create(path, specs)
	if err != nil {
		return Segment{}, fmt.Errorf("write segment: %w", err)
	}
	for _, t := range tensors {
		if err := w.Write(t.Name, t.Data); err != nil {
			w.Abort()
			return Segment{}, fmt.Errorf("write segment: %w", err)
		}
	}
	return w.Commit()
}

// Mapped is a complete segment mapped read-only. It is a *safetensors.File (Bytes, Float32,
// Int64, Info, Names, Close) that has also passed the segment checks.
type Mapped struct {
	*safetensors.File
}

// Open maps the complete segment at path read-only. It refuses "*.partial" files and a path not
// yet committed (ErrIncomplete), files whose header is invalid (wrapping safetensors.ErrInvalid)
// and files whose data is not page-aligned (ErrMisaligned). The mapping stays valid after the
// file is removed, until Close.
func Open(path string) (*Mapped, error) {
	if strings.HasSuffix(path, PartialExt) {
		return nil, fmt.Errorf("open segment %s: %w", path, ErrIncomplete)
	}
	f, err := safetensors.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if _, perr := os.Stat(path + PartialExt); perr == nil {
				return nil, fmt.Errorf("open segment %s: %w (still being written)", path, ErrIncomplete)
			}
		}
		return nil, fmt.Errorf("open segment: %w", err)
	}
	if ds := f.Header().DataStart; ds%Align != 0 {
		f.Close()
		return nil, fmt.Errorf("open segment %s: %w: data starts at byte %d", filepath.Base(path), ErrMisaligned, ds)
	}
	return &Mapped{File: f}, nil
}

// Segment describes the mapped segment.
func (m *Mapped) Segment() Segment {
	h := m.Header()
	s := Segment{Path: m.Path(), Tensors: make([]TensorSpec, len(h.Tensors))}
	for i, t := range h.Tensors {
		s.Tensors[i] = TensorSpec{Name: t.Name, DType: t.DType, Shape: cloneShape(t.Shape)}
	}
	return s
}

// cloneShape copies a shape; the copy is never nil, so scalars compare equal however they came.
func cloneShape(s []int64) []int64 {
	out := make([]int64, len(s))
	copy(out, s)
	return out
}
