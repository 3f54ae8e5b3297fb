package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// MaxHeaderSize caps the JSON header length a reader accepts (100 MiB, as the reference
// implementation does), so a corrupt length cannot make us allocate the world.
const MaxHeaderSize = 100 << 20

// ErrInvalid is wrapped by every error that reports a malformed file, so callers can tell bad
// input from I/O trouble with errors.Is.
var ErrInvalid = errors.New("invalid safetensors")

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int64
	// Begin and End are byte offsets relative to the start of the data section.
	Begin, End int64
}

// NumElements returns the number of elements (1 for a scalar).
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Header is a parsed and validated safetensors header.
type Header struct {
	// Tensors in data order (by begin offset, then name).
	Tensors []TensorInfo
	// Metadata is the optional "__metadata__" string map.
	Metadata map[string]string
	// DataStart is the absolute file offset of the data section (8 + header length).
	DataStart int64
	byName    map[string]int
}

// Lookup returns the tensor named name.
func (h *Header) Lookup(name string) (TensorInfo, bool) {
	i, ok := h.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return h.Tensors[i], true
}

type rawEntry struct {
	DType       *string  `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// ParseHeader validates the header at the start of a file of fileSize bytes. prefix must hold at
// least the first 8 bytes and, when they announce n header bytes, the following n bytes too
// (ReadHeaderFrom reads exactly that much). Every structural rule is checked: length within the
// cap and the file, valid JSON object, known dtypes, non-negative shapes, offsets inside the data
// section, byte counts equal to shape × dtype size, and no two tensors overlapping.
func ParseHeader(prefix []byte, fileSize int64) (*Header, error) {
	if fileSize < 8 || len(prefix) < 8 {
		return nil, invalidf("file is %d bytes, shorter than the 8-byte header length", fileSize)
	}
	n := binary.LittleEndian.Uint64(prefix[:8])
	if n > MaxHeaderSize {
		return nil, invalidf("header length %d exceeds the %d-byte cap", n, MaxHeaderSize)
	}
	if int64(n) > fileSize-8 {
		return nil, invalidf("header length %d is longer than the file (%d bytes after the length)", n, fileSize-8)
	}
	if uint64(len(prefix)-8) < n {
		return nil, invalidf("header truncated: need %d bytes, have %d", n, len(prefix)-8)
	}
	raw := prefix[8 : 8+n]
	h := &Header{DataStart: 8 + int64(n), byName: map[string]int{}}
	dataSize := fileSize - h.DataStart

	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, invalidf("header is not JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, invalidf("header is not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, invalidf("header is not JSON: %v", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, invalidf("header key is not a string")
		}
		if name == "__metadata__" {
			if h.Metadata != nil {
				return nil, invalidf("duplicate __metadata__")
			}
			if err := dec.Decode(&h.Metadata); err != nil {
				return nil, invalidf("__metadata__ is not a string map: %v", err)
			}
			if h.Metadata == nil {
				h.Metadata = map[string]string{}
			}
			continue
		}
		if _, dup := h.byName[name]; dup {
			return nil, invalidf("tensor %q appears twice", name)
		}
		var e rawEntry
		if err := dec.Decode(&e); err != nil {
			return nil, invalidf("tensor %q: bad entry: %v", name, err)
		}
		info, err := checkEntry(name, e, dataSize)
		if err != nil {
			return nil, err
		}
		h.byName[name] = len(h.Tensors)
		h.Tensors = append(h.Tensors, info)
	}
	if _, err := dec.Token(); err != nil {
		return nil, invalidf("header is not JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, invalidf("trailing data after the header object")
	}

	sort.SliceStable(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.Name < b.Name
	})
	var prev *TensorInfo
	for i := range h.Tensors {
		t := &h.Tensors[i]
		h.byName[t.Name] = i
		if t.End == t.Begin {
			continue // empty tensors occupy no bytes
		}
		if prev != nil && t.Begin < prev.End {
			return nil, invalidf("tensors %q [%d,%d) and %q [%d,%d) overlap", prev.Name, prev.Begin, prev.End, t.Name, t.Begin, t.End)
		}
		prev = t
	}
	return h, nil
}

func checkEntry(name string, e rawEntry, dataSize int64) (TensorInfo, error) {
	if e.DType == nil || e.Shape == nil || e.DataOffsets == nil {
		return TensorInfo{}, invalidf("tensor %q: entry needs dtype, shape and data_offsets", name)
	}
	dt := DType(*e.DType)
	if !dt.Valid() {
		return TensorInfo{}, invalidf("tensor %q: unknown dtype %q", name, *e.DType)
	}
	numel := int64(1)
	for _, d := range *e.Shape {
		if d < 0 {
			return TensorInfo{}, invalidf("tensor %q: negative dimension in shape %v", name, *e.Shape)
		}
		if d != 0 && numel > math.MaxInt64/8/d {
			return TensorInfo{}, invalidf("tensor %q: shape %v is too large", name, *e.Shape)
		}
		numel *= d
	}
	offs := *e.DataOffsets
	if len(offs) != 2 {
		return TensorInfo{}, invalidf("tensor %q: data_offsets must have 2 entries, has %d", name, len(offs))
	}
	begin, end := offs[0], offs[1]
	if begin < 0 || end < begin {
		return TensorInfo{}, invalidf("tensor %q: bad data_offsets [%d,%d]", name, begin, end)
	}
	if end > dataSize {
		return TensorInfo{}, invalidf("tensor %q: data_offsets [%d,%d] out of bounds (data section is %d bytes)", name, begin, end, dataSize)
	}
	if want := numel * int64(dt.Size()); end-begin != want {
		return TensorInfo{}, invalidf("tensor %q: %d bytes for shape %v of %s, expected %d", name, end-begin, *e.Shape, dt, want)
	}
	return TensorInfo{Name: name, DType: dt, Shape: append([]int64(nil), (*e.Shape)...), Begin: begin, End: end}, nil
}

// ReadHeader reads and validates the header of r, a file of fileSize bytes.
func ReadHeader(r io.ReaderAt, fileSize int64) (*Header, error) {
	var lenBuf [8]byte
	if fileSize < 8 {
		return nil, invalidf("file is %d bytes, shorter than the 8-byte header length", fileSize)
	}
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("read header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderSize || int64(n) > fileSize-8 {
		return ParseHeader(lenBuf[:], fileSize)
	}
	buf := make([]byte, 8+n)
	if _, err := r.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	return ParseHeader(buf, fileSize)
}
