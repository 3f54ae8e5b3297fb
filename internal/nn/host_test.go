package nn

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// hostBlock binds one block of a Linear and a LayerNorm under name into l.
func hostBlock(l *Loader, name string, in, out int) {
	NewLinear(l, Join(name, "fc"), in, out, true)
	NewLayerNorm(l, Join(name, "norm"), out, 1e-5)
}

func float32s(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	return v
}

// TestHostCopy binds blocks into host copies (a weight converted by the runtime, the rest
// copied from the checkpoint), small and past a huge page, and checks that each buffer was
// allocated once at its exact size, holds every tensor as a resident bind would upload it,
// and is released by Free.
func TestHostCopy(t *testing.T) {
	rt := newRuntime(t)
	t.Logf("transparent huge pages: %q", TransparentHugePages())
	for _, c := range []struct {
		name    string
		in, out int
	}{{"small", 3, 4}, {"large", 1024, 1536}} { // large: a 6 MiB F32 weight, above hugePageSize
		t.Run(c.name, func(t *testing.T) {
			ck := checkpoint(t,
				safetensors.FromFloat32("blocks.0.fc.weight", []int64{int64(c.out), int64(c.in)}, float32s(c.in*c.out, 1)),
				safetensors.FromFloat32("blocks.0.fc.bias", []int64{int64(c.out)}, float32s(c.out, 2)),
				safetensors.FromFloat32("blocks.0.norm.weight", []int64{int64(c.out)}, float32s(c.out, 3)),
				safetensors.FromFloat32("blocks.0.norm.bias", []int64{int64(c.out)}, float32s(c.out, 4)),
			)
			o := Options{DType: runtime.F32, WeightDType: runtime.BF16}
			l := NewLoader(rt, ck, o, "model.")
			h := l.BeginHost("blocks.0.")
			hostBlock(l, "blocks.0", c.in, c.out)
			if _, err := h.Bytes("fc.bias"); err == nil || !strings.Contains(err.Error(), "not filled yet") {
				t.Errorf("bytes before EndHost: %v", err)
			}
			l.EndHost()
			ws, _, err := l.Finish()
			if err != nil {
				t.Fatal(err)
			}
			defer ws.Free()
			if ws.NumTensors() != 0 {
				t.Errorf("%d tensors uploaded, want none", ws.NumTensors())
			}
			want := int64(2*c.in*c.out + 3*4*c.out) // BF16 weight, three F32 vectors
			if h.allocs != 1 || h.NumBytes() != want || len(h.Buffer()) != int(want) || l.HostBytes() != want {
				t.Fatalf("host copy: %d allocations, %d bytes (buffer %d, loader %d), want 1 of %d", h.allocs, h.NumBytes(), len(h.Buffer()), l.HostBytes(), want)
			}
			if c.in*c.out*2 >= hugePageSize {
				if addr := uintptr(unsafe.Pointer(unsafe.SliceData(h.Buffer()))); addr%hugePageSize != 0 {
					t.Errorf("buffer at %#x is not aligned to %d", addr, hugePageSize)
				}
				t.Logf("advised huge pages: %v", h.HugePages())
			}
			// The same block bound resident: every host tensor must be its bytes and dtype.
			rl := NewLoader(rt, ck, o, "model.")
			hostBlock(rl, "blocks.0", c.in, c.out)
			rws, _, err := rl.Finish()
			if err != nil {
				t.Fatal(err)
			}
			defer rws.Free()
			names := h.Names()
			if len(names) != len(rws.tensors) || names[0] != "fc.weight" {
				t.Fatalf("host names %v for %d resident tensors", names, len(rws.tensors))
			}
			for i, name := range names {
				got, err := h.Bytes(name)
				if err != nil {
					t.Fatal(err)
				}
				res, err := rws.tensors[i].Bytes()
				if err != nil {
					t.Fatal(err)
				}
				if h.DType(name) != rws.tensors[i].DType() || !bytes.Equal(got, res) {
					t.Errorf("%s: host %s differs from resident %s", name, h.DType(name), rws.tensors[i].DType())
				}
			}
			if err := h.Free(); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Bytes("fc.bias"); err == nil || !strings.Contains(err.Error(), "freed") {
				t.Errorf("bytes after Free: %v", err)
			}
			if err := h.Free(); err != nil || h.NumBytes() != 0 {
				t.Errorf("second Free: %v, %d bytes left", err, h.NumBytes())
			}
		})
	}
}

// TestHostCopyRandom checks random mode: one allocation, the values a resident random load of
// the same seed makes.
func TestHostCopyRandom(t *testing.T) {
	rt := newRuntime(t)
	o := Options{DType: runtime.F32, WeightDType: runtime.F16}
	l := NewRandomLoader(rt, 7, o)
	h := l.BeginHost("b.")
	hostBlock(l, "b", 8, 16)
	l.EndHost()
	if _, _, err := l.Finish(); err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	rl := NewRandomLoader(rt, 7, o)
	hostBlock(rl, "b", 8, 16)
	rws, _, err := rl.Finish()
	if err != nil {
		t.Fatal(err)
	}
	defer rws.Free()
	if h.allocs != 1 || h.NumBytes() != 2*8*16+3*4*16 {
		t.Fatalf("%d allocations, %d bytes", h.allocs, h.NumBytes())
	}
	for i, name := range h.Names() {
		got, _ := h.Bytes(name)
		res, err := rws.tensors[i].Bytes()
		if err != nil || !bytes.Equal(got, res) {
			t.Errorf("%s: host differs from resident (%v)", name, err)
		}
	}
}

// TestHostCopyFailedLoad checks that a failed load frees the host copies it made.
func TestHostCopyFailedLoad(t *testing.T) {
	rt := newRuntime(t)
	ck := checkpoint(t,
		safetensors.FromFloat32("b.0.fc.weight", []int64{4, 3}, float32s(12, 1)),
		safetensors.FromFloat32("b.0.fc.bias", []int64{4}, float32s(4, 2)),
		safetensors.FromFloat32("b.0.norm.weight", []int64{4}, float32s(4, 3)),
		safetensors.FromFloat32("b.0.norm.bias", []int64{4}, float32s(4, 4)),
	)
	l := NewLoader(rt, ck, Options{}, "model.")
	h := l.BeginHost("b.0.")
	hostBlock(l, "b.0", 3, 4)
	l.EndHost()
	if h.NumBytes() != 4*(12+3*4) {
		t.Fatalf("host copy of %d bytes", h.NumBytes())
	}
	NewLinear(l, "missing", 3, 4, false)
	if _, _, err := l.Finish(); err == nil {
		t.Fatal("a missing tensor loaded")
	}
	if _, err := h.Bytes("fc.bias"); err == nil || !strings.Contains(err.Error(), "freed") {
		t.Errorf("host copy after a failed load: %v", err)
	}
}

// TestCopyParallel copies parts of assorted sizes (empty, below, at and across copyChunk)
// with several workers.
func TestCopyParallel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 7, copyChunk - 1, copyChunk, copyChunk + 1, 3*copyChunk + 5, 100}
	var total int
	for _, n := range sizes {
		total += n
	}
	src := make([]byte, total)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	for _, workers := range []int{1, 3, 16} {
		dst := make([]byte, total)
		var parts []copyPart
		off := 0
		for _, n := range sizes {
			parts = append(parts, copyPart{dst: dst[off : off+n], src: src[off : off+n]})
			off += n
		}
		copyParallel(parts, workers)
		if !bytes.Equal(dst, src) {
			t.Errorf("%d workers: copy differs", workers)
		}
	}
}
