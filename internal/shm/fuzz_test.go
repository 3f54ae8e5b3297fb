package shm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
)

// FuzzSegmentRead feeds arbitrary files to Open. A file is either rejected with a typed error or
// accepted as a segment whose every tensor reads back, lies inside the file, and survives a
// rewrite with WriteSegment unchanged.
//
// To keep inputs small (minimising a 4 KiB input takes the fuzzer minutes), an input is a header
// and a data part: with raw set the file is header+data as given; otherwise the file is a length
// prefix, the header padded with spaces to the 4096-byte boundary, then data.
func FuzzSegmentRead(f *testing.F) {
	good := goodSegment(f)
	f.Add(true, good, []byte{})
	f.Add(true, good[:len(good)-3], []byte{})
	f.Add(true, []byte{8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '}, []byte{})
	f.Add(false, []byte(`{}`), []byte{})
	f.Add(false, []byte(`{"__metadata__":{"k":"v"},"t":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]}}`), []byte{1, 2, 3, 4})
	f.Add(false, []byte(`{"a":{"dtype":"F16","shape":[],"data_offsets":[0,2]},"b":{"dtype":"I64","shape":[1],"data_offsets":[2,10]}}`), make([]byte, 10))
	f.Add(false, []byte(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}`), []byte{0, 1, 1})
	f.Add(false, []byte(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`), []byte{1, 2, 3})

	dir := f.TempDir()
	path := filepath.Join(dir, "f.safetensors")
	again := filepath.Join(dir, "again.safetensors")
	f.Fuzz(func(t *testing.T, raw bool, header, data []byte) {
		var file []byte
		if raw {
			file = append(append(file, header...), data...)
		} else {
			n := (8 + len(header) + shm.Align - 1) / shm.Align * shm.Align
			file = binary.LittleEndian.AppendUint64(file, uint64(n-8))
			file = append(file, header...)
			file = append(file, bytes.Repeat([]byte{' '}, n-len(file))...)
			file = append(file, data...)
		}
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := shm.Open(path)
		if err != nil {
			if !errors.Is(err, safetensors.ErrInvalid) && !errors.Is(err, shm.ErrMisaligned) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		defer m.Close()
		h := m.Header()
		if h.DataStart%shm.Align != 0 {
			t.Fatalf("accepted data start %d", h.DataStart)
		}
		seg := m.Segment()
		var in []safetensors.Tensor
		for _, ts := range seg.Tensors {
			b, err := m.Bytes(ts.Name)
			if err != nil {
				t.Fatalf("tensor %q listed but unreadable: %v", ts.Name, err)
			}
			if int64(len(b)) != ts.Bytes() {
				t.Fatalf("tensor %q: %d bytes, spec says %d", ts.Name, len(b), ts.Bytes())
			}
			if ts.DType.IsFloat() {
				if v, _, err := m.Float32(ts.Name); err != nil || int64(len(v))*int64(ts.DType.Size()) != ts.Bytes() {
					t.Fatalf("tensor %q: float32 read: %d values, %v", ts.Name, len(v), err)
				}
			}
			in = append(in, safetensors.Tensor{Name: ts.Name, DType: ts.DType, Shape: ts.Shape, Data: b})
		}
		// Round trip: what was read, written again as a segment, reads back the same.
		if _, err := shm.WriteSegment(again, in); err != nil {
			t.Fatalf("rewrite accepted segment: %v", err)
		}
		m2, err := shm.Open(again)
		if err != nil {
			t.Fatalf("reopen rewritten segment: %v", err)
		}
		defer m2.Close()
		seg2 := m2.Segment()
		seg2.Path = seg.Path
		if !reflect.DeepEqual(seg, seg2) {
			t.Fatalf("round trip changed the segment:\n%+v\n%+v", seg, seg2)
		}
		for _, tn := range in {
			if b, _ := m2.Bytes(tn.Name); !bytes.Equal(b, tn.Data) {
				t.Fatalf("round trip changed tensor %q", tn.Name)
			}
		}
	})
}
