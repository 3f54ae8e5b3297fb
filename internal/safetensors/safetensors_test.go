package safetensors_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// TestFixtureFilesLoad opens every .safetensors file under the fixture set's models/ and cases/,
// reads every tensor, and checks names, dtypes and shapes against the header JSON parsed on its
// own with encoding/json.
func TestFixtureFilesLoad(t *testing.T) {
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, sub := range []string{"models", "cases"} {
		filepath.WalkDir(filepath.Join(root, sub), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".safetensors") {
				files = append(files, p)
			}
			return nil
		})
	}
	if len(files) == 0 {
		t.Fatalf("no .safetensors files under %s", root)
	}
	for _, p := range files {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		n := binary.LittleEndian.Uint64(raw)
		var hdr map[string]json.RawMessage
		if err := json.Unmarshal(raw[8:8+n], &hdr); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		f, err := safetensors.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		count := 0
		for name, ent := range hdr {
			if name == "__metadata__" {
				continue
			}
			count++
			var e struct {
				DType string  `json:"dtype"`
				Shape []int64 `json:"shape"`
			}
			json.Unmarshal(ent, &e)
			info, ok := f.Info(name)
			if !ok {
				t.Errorf("%s: tensor %q missing", p, name)
				continue
			}
			if string(info.DType) != e.DType || !parity.SameShape(info.Shape, e.Shape) {
				t.Errorf("%s: %q is %s%v, header says %s%v", p, name, info.DType, info.Shape, e.DType, e.Shape)
			}
			v, shape, err := f.Float32(name)
			if err != nil {
				t.Errorf("%s: %q: %v", p, name, err)
				continue
			}
			if int64(len(v)) != info.NumElements() || !parity.SameShape(shape, e.Shape) {
				t.Errorf("%s: %q: %d values for shape %v", p, name, len(v), shape)
			}
		}
		if count != len(f.Names()) {
			t.Errorf("%s: %d tensors in header, reader has %d", p, count, len(f.Names()))
		}
		t.Logf("%s: %d tensors", strings.TrimPrefix(p, root+"/"), count)
		f.Close()
	}
}

func TestRoundTripAligned(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.safetensors")
	vals := []float32{1, -2.5, float32(math.Inf(1)), 3e-39}
	ts := []safetensors.Tensor{
		safetensors.FromFloat32("a", []int64{2, 2}, vals),
		safetensors.FromInt64("idx", []int64{3}, []int64{-1, 0, 1 << 40}),
		safetensors.FromUint8("u", []int64{2, 1, 3}, []byte{0, 1, 2, 253, 254, 255}),
		safetensors.FromFloat32("empty", []int64{0, 4}, nil),
		safetensors.FromFloat32("scalar", []int64{}, []float32{7}),
	}
	if err := safetensors.WriteFile(p, ts, safetensors.WriteOptions{Align: 4096, Metadata: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p + ".partial"); !os.IsNotExist(err) {
		t.Fatalf("partial file left behind: %v", err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	f, err := safetensors.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Header().DataStart%4096 != 0 {
		t.Errorf("data starts at %d, not 4096-aligned", f.Header().DataStart)
	}
	if f.Metadata()["k"] != "v" {
		t.Errorf("metadata %v", f.Metadata())
	}
	got, shape, err := f.Float32("a")
	if err != nil || !parity.SameShape(shape, []int64{2, 2}) {
		t.Fatal(err, shape)
	}
	for i := range vals {
		if math.Float32bits(got[i]) != math.Float32bits(vals[i]) {
			t.Errorf("a[%d] = %v, want %v", i, got[i], vals[i])
		}
	}
	ints, _, err := f.Int64("idx")
	if err != nil || ints[0] != -1 || ints[2] != 1<<40 {
		t.Errorf("idx = %v, %v", ints, err)
	}
	u, _ := f.Bytes("u")
	if string(u) != string([]byte{0, 1, 2, 253, 254, 255}) {
		t.Errorf("u = %v", u)
	}
	if v, shape, err := f.Float32("scalar"); err != nil || len(v) != 1 || v[0] != 7 || len(shape) != 0 {
		t.Errorf("scalar = %v %v %v", v, shape, err)
	}
	if _, _, err := f.Int64("a"); err == nil {
		t.Errorf("Int64 of an F32 tensor should fail")
	}
}

func TestWriterRejects(t *testing.T) {
	dir := t.TempDir()
	cases := map[string][]safetensors.Tensor{
		"byte count": {{Name: "a", DType: safetensors.F32, Shape: []int64{3}, Data: make([]byte, 8)}},
		"dtype":      {{Name: "a", DType: "F8", Shape: []int64{1}, Data: make([]byte, 1)}},
		"duplicate":  {safetensors.FromFloat32("a", []int64{1}, []float32{1}), safetensors.FromFloat32("a", []int64{1}, []float32{1})},
		"reserved":   {safetensors.FromFloat32("__metadata__", []int64{1}, []float32{1})},
		"negative":   {{Name: "a", DType: safetensors.U8, Shape: []int64{-1}}},
	}
	for name, ts := range cases {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := safetensors.WriteFile(p, ts, safetensors.WriteOptions{}); err == nil {
			t.Errorf("%s: no error", name)
		}
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s: file left behind", name)
		}
		if _, err := os.Stat(p + ".partial"); !os.IsNotExist(err) {
			t.Errorf("%s: partial file left behind", name)
		}
	}
}

// rawFile builds a file from a literal header and data length.
func rawFile(header string, data int) []byte {
	b := make([]byte, 8+len(header)+data)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	copy(b[8:], header)
	return b
}

func TestCorruptFiles(t *testing.T) {
	good := rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8)
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty file", nil, "shorter than the 8-byte header length"},
		{"short length", []byte{1, 2, 3}, "shorter than the 8-byte header length"},
		{"header longer than file", func() []byte { b := append([]byte(nil), good...); binary.LittleEndian.PutUint64(b, 1<<20); return b }(), "longer than the file"},
		{"header over cap", func() []byte { b := append([]byte(nil), good...); binary.LittleEndian.PutUint64(b, 1<<40); return b }(), "exceeds"},
		{"truncated data", good[:len(good)-3], `"a"`},
		{"not json", rawFile(`{"a":`, 0), "bad entry"},
		{"garbage", rawFile(`xyz`, 0), "not JSON"},
		{"not an object", rawFile(`[1,2]`, 0), "not a JSON object"},
		{"trailing", rawFile(`{} {}`, 0), "trailing"},
		{"unknown dtype", rawFile(`{"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}}`, 1), `unknown dtype "F8"`},
		{"offsets out of bounds", rawFile(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}`, 4), "out of bounds"},
		{"reversed offsets", rawFile(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 4), "bad data_offsets"},
		{"wrong byte count", rawFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 12), "expected 12"},
		{"overlap", rawFile(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, 8), "overlap"},
		{"duplicate", rawFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), "twice"},
		{"missing field", rawFile(`{"a":{"dtype":"U8","shape":[1]}}`, 1), "needs dtype"},
		{"negative dim", rawFile(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`, 0), "negative"},
		{"huge shape", rawFile(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0), "too large"},
		{"three offsets", rawFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, 2), "2 entries"},
		{"bad metadata", rawFile(`{"__metadata__":{"k":1}}`, 0), "__metadata__"},
	}
	dir := t.TempDir()
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "f"+string(rune('a'+i))+".safetensors")
			if err := os.WriteFile(p, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := safetensors.Open(p)
			if err == nil {
				f.Close()
				t.Fatalf("no error")
			}
			if !errors.Is(err, safetensors.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Errorf("error %q should name the file and say %q", err, tc.want)
			}
		})
	}
	// Random bytes never panic and never validate by accident as a non-empty header.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		b := make([]byte, rng.IntN(512))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if _, err := safetensors.ParseHeader(b, int64(len(b))); err == nil && len(b) > 16 {
			t.Logf("random input %d parsed", i)
		}
	}
}

func TestShardedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	if err := safetensors.WriteFile(filepath.Join(dir, "m-00001-of-00002.safetensors"),
		[]safetensors.Tensor{safetensors.FromFloat32("w1", []int64{2}, []float32{1, 2})}, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "m-00002-of-00002.safetensors"),
		[]safetensors.Tensor{safetensors.FromFloat32("w2", []int64{1}, []float32{3})}, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	idx := `{"metadata":{},"weight_map":{"w1":"m-00001-of-00002.safetensors","w2":"m-00002-of-00002.safetensors"}}`
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(idx), 0o600)
	c, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Names(), ","); got != "w1,w2" {
		t.Errorf("names %s", got)
	}
	v, _, err := c.Float32("w2")
	if err != nil || v[0] != 3 {
		t.Errorf("w2 = %v %v", v, err)
	}
	c.Close()

	os.Remove(filepath.Join(dir, "m-00002-of-00002.safetensors"))
	if _, err := safetensors.OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), "m-00002-of-00002.safetensors") || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing shard: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(`{"weight_map":{"w9":"m-00001-of-00002.safetensors"}}`), 0o600)
	if _, err := safetensors.OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), `"w9"`) {
		t.Errorf("tensor missing from shard: %v", err)
	}
	if _, err := safetensors.OpenCheckpoint(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no .safetensors") {
		t.Errorf("empty dir: %v", err)
	}
}

// TestHalfConversions checks every f16 and bf16 bit pattern converts to float32 and back exactly.
func TestHalfConversions(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := safetensors.F16ToF32(uint16(h))
		back := safetensors.F32ToF16(f)
		if f != f { // NaN keeps being NaN
			if safetensors.F16ToF32(back) == safetensors.F16ToF32(back) {
				t.Fatalf("f16 NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, back)
		}
		b := safetensors.BF16ToF32(uint16(h))
		if b == b && safetensors.F32ToBF16(b) != uint16(h) {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, b, safetensors.F32ToBF16(b))
		}
	}
	// Known values and round-to-nearest-even.
	checks := []struct {
		f    float32
		want uint16
	}{{1, 0x3c00}, {65504, 0x7bff}, {65520, 0x7c00}, {5.960464477539063e-08, 0x0001}, {2.980232238769531e-08, 0x0000}, {1.0009765625 + 0.00048828125, 0x3c02}}
	for _, c := range checks {
		if got := safetensors.F32ToF16(c.f); got != c.want {
			t.Errorf("F32ToF16(%v) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if got := safetensors.F32ToBF16(1.00390625); got != 0x3f80 { // tie to even
		t.Errorf("F32ToBF16 tie = %#04x", got)
	}
}

// FuzzHeader feeds arbitrary bytes to the header parser: it must return an error or a header
// whose tensors all lie inside the file, never panic.
func FuzzHeader(f *testing.F) {
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8))
	f.Add(rawFile(`{"__metadata__":{"x":"y"},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}}`, 4))
	f.Add(rawFile(`{}`, 0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := safetensors.ParseHeader(b, int64(len(b)))
		if err != nil {
			if !errors.Is(err, safetensors.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		for _, ti := range h.Tensors {
			if ti.Begin < 0 || ti.End < ti.Begin || h.DataStart+ti.End > int64(len(b)) {
				t.Fatalf("tensor %q [%d,%d) outside a %d-byte file", ti.Name, ti.Begin, ti.End, len(b))
			}
			if ti.End-ti.Begin != ti.NumElements()*int64(ti.DType.Size()) {
				t.Fatalf("tensor %q byte count mismatch", ti.Name)
			}
		}
	})
}
