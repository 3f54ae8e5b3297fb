package runtime

import (
	"errors"
	"testing"
)

func TestMemoryCapOOM(t *testing.T) {
	rt := newTestRuntime(t, Options{MemoryCap: 1000})
	a, err := rt.NewTensor(F32, 200) // 800 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	_, err = rt.NewTensor(F32, 100) // 400 more: over the cap
	var oom *OOMError
	if !errors.As(err, &oom) || !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("allocation over the cap: got %v, want *OOMError", err)
	}
	if oom.Requested != 400 || oom.Available != 200 {
		t.Fatalf("OOM sizes: requested %d available %d, want 400 and 200", oom.Requested, oom.Available)
	}
	m := rt.Memory()
	if m.Allocated != 800 || m.Cap != 1000 || m.LiveTensors != 1 {
		t.Fatalf("after a refused allocation: %+v", m)
	}
	// an op whose output does not fit fails the same way and leaves nothing behind
	if _, err := rt.Copy(a); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("copy over the cap: got %v, want out of memory", err)
	}
	if m := rt.Memory(); m.Allocated != 800 || m.LiveTensors != 1 {
		t.Fatalf("after a failed op: %+v", m)
	}
	if m.Peak != 800 {
		t.Fatalf("peak %d, want 800", m.Peak)
	}
	if err := rt.SetMemoryCap(0); err != nil {
		t.Fatal(err)
	}
	b, err := rt.Copy(a)
	if err != nil {
		t.Fatalf("copy without a cap: %v", err)
	}
	b.Free()
	if m := rt.Memory(); m.Peak != 1600 {
		t.Fatalf("peak %d, want 1600", m.Peak)
	}
	if err := rt.ResetPeak(); err != nil {
		t.Fatal(err)
	}
	if m := rt.Memory(); m.Peak != 800 {
		t.Fatalf("peak after reset %d, want 800", m.Peak)
	}
}

// TestScratchOOM: the tensors fit but an op's scratch (conv im2col, attention scores) does not at
// its preferred size: the op narrows its bands or chunks and succeeds; when even the narrowest
// does not fit, the typed error comes out of the op (through the conv chain) and nothing leaks.
// The sizes are the cpu backend's im2col bands and attention chunks.
func TestScratchOOM(t *testing.T) {
	const cap = 64 << 10
	rt := newTestRuntime(t, Options{Backend: "cpu", MemoryCap: cap})
	r := rng(t)
	xs, ws := []int{1, 8, 3, 16, 16}, []int{2, 8, 3, 3, 3} // x 24 KiB; one band of 16 rows 216 KiB
	x, xv := randTensor(t, rt, r, xs...)
	w, wv := randTensor(t, rt, r, ws...)
	p := Conv3dParams{Padding: [3]int{1, 1, 1}}
	want, shape := refConv3d(xv, xs, wv, ws, nil, p)
	y, err := rt.Conv3d(x, w, nil, p)
	check(t, "conv in narrow bands", y, err, shape, want)

	big, _ := randTensor(t, rt, r, 1, 8, 3, 4, 40) // one output row of im2col: 216·40·4 = 34 KiB
	_, err = rt.Conv3d(big, w, nil, p)
	var oom *OOMError
	if !errors.As(err, &oom) {
		t.Fatalf("conv whose one-row band is over the cap: got %v, want *OOMError", err)
	}
	if oom.Requested != 216*40*4 {
		t.Fatalf("requested %d, want the one-row im2col band %d", oom.Requested, 216*40*4)
	}
	st := rt.ConvStats()
	if st.Tiers[TierCPU].Failures != 1 || st.Failed != 1 {
		t.Fatalf("stats after OOM: %+v", st)
	}
	if len(rt.chain.local) != 1 { // the earlier success only: an OOM is not a shape decision
		t.Fatalf("decisions %v", rt.chain.local)
	}
	big.Free()

	q, qv := randTensor(t, rt, r, 1, 1, 40, 4)
	k, kv := randTensor(t, rt, r, 1, 1, 300, 4) // all 40 query rows of scores: 47 KiB
	wantA := refAttention(qv, kv, kv, 1, 1, 1, 40, 300, 4, 4, nil, nil, float64(float32(0.5)))
	y, err = rt.Attention(q, k, k, nil, AttentionParams{Tier: AttentionChunked})
	check(t, "attention in smaller chunks", y, err, []int{1, 1, 40, 4}, wantA)
	if _, err := rt.Attention(q, k, k, nil, AttentionParams{QueryChunk: 40, Tier: AttentionChunked}); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("attention with an explicit chunk over the cap: got %v, want out of memory", err)
	}
}

func TestTensorLifecycle(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	x, err := rt.FromFloat32([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	v, err := x.Reshape(3, -1)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Shape(); !equalInts(got, []int{3, 2}) {
		t.Fatalf("reshape shape %v", got)
	}
	if m := rt.Memory(); m.Allocated != 24 || m.LiveTensors != 2 {
		t.Fatalf("a reshape must share storage: %+v", m)
	}
	x.Free()
	x.Free() // idempotent
	got, err := v.Float32()
	if err != nil || got[5] != 6 {
		t.Fatalf("view after the original was freed: %v %v", got, err)
	}
	if _, err := x.Float32(); !errors.Is(err, ErrFreed) {
		t.Fatalf("download after free: got %v, want ErrFreed", err)
	}
	if _, err := rt.SiLU(x); !errors.Is(err, ErrFreed) {
		t.Fatalf("op on a freed tensor: got %v, want ErrFreed", err)
	}
	if _, err := v.Reshape(4, -1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad reshape: got %v", err)
	}
	if err := rt.Close(); err == nil {
		t.Fatal("close with a live tensor must fail")
	}
	v.Free()

	var sc Scope
	a, err := sc.Track(rt.Zeros(F32, 4, 4))
	if err != nil {
		t.Fatal(err)
	}
	b, err := sc.Track(rt.Full(F32, 2, 4, 4))
	if err != nil {
		t.Fatal(err)
	}
	c, err := sc.Track(rt.Add(a, b))
	if err != nil {
		t.Fatal(err)
	}
	keep := sc.Keep(c)
	if sc.Len() != 2 {
		t.Fatalf("scope holds %d, want 2", sc.Len())
	}
	sc.Free()
	vals, err := keep.Float32()
	if err != nil || vals[15] != 2 {
		t.Fatalf("kept tensor: %v %v", vals, err)
	}
	keep.Free()

	other := newTestRuntime(t, Options{})
	o, err := other.Zeros(F32, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	z, err := rt.Zeros(F32, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Free()
	if _, err := rt.Add(z, o); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("mixing runtimes: got %v", err)
	}
}

// TestBadArguments: wrong shapes and dtypes come back as ErrInvalidArgument/ErrUnsupported,
// never a crash. On any backend (FRAMEPACK_BACKEND), but for the cpu backend's refusal of f16
// compute, which a cpu runtime asserts beside it.
func TestBadArguments(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	cpu := newTestRuntime(t, Options{Backend: "cpu"})
	r := rng(t)
	x, _ := randTensor(t, rt, r, 2, 3, 4)
	w, _ := randTensor(t, rt, r, 5, 4)
	xc, _ := randTensor(t, cpu, r, 2, 3, 4)
	h, err := cpu.Cast(xc, F16)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	ids, err := rt.FromInt32([]int32{1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ids.Free()
	cases := []struct {
		name string
		f    func() (*Tensor, error)
		want error
	}{
		{"matmul inner", func() (*Tensor, error) { return rt.MatMul(x, w, GemmParams{}) }, ErrInvalidArgument},
		{"linear bias size", func() (*Tensor, error) { return rt.Linear(x, w, w) }, ErrInvalidArgument},
		{"layer norm weight", func() (*Tensor, error) { return rt.LayerNorm(x, w, nil, 1e-5) }, ErrInvalidArgument},
		{"group norm groups", func() (*Tensor, error) { return rt.GroupNorm(x, nil, nil, 2, 1e-5) }, ErrInvalidArgument},
		{"conv rank", func() (*Tensor, error) { return rt.Conv3d(x, w, nil, Conv3dParams{}) }, ErrInvalidArgument},
		{"attention rank", func() (*Tensor, error) { return rt.Attention(x, x, x, nil, AttentionParams{}) }, ErrInvalidArgument},
		{"attention mask dtype", func() (*Tensor, error) {
			q, err := x.Reshape(1, 2, 3, 4)
			if err != nil {
				return nil, err
			}
			defer q.Free()
			return rt.Attention(q, q, q, q, AttentionParams{})
		}, ErrInvalidArgument},
		{"rope odd", func() (*Tensor, error) {
			y, err := x.Reshape(2, 12)
			if err != nil {
				return nil, err
			}
			defer y.Free()
			z, err := x.Reshape(8, 3)
			if err != nil {
				return nil, err
			}
			defer z.Free()
			return rt.RoPE(RoPEInterleaved, z, z, z)
		}, ErrInvalidArgument},
		{"slice dim", func() (*Tensor, error) { return rt.Slice(x, 3, 0, 1) }, ErrInvalidArgument},
		{"permute", func() (*Tensor, error) { return rt.Permute(x, 0, 0, 1) }, ErrInvalidArgument},
		{"pad negative", func() (*Tensor, error) { return rt.Pad(x, PadZero, []int{0, -1, 0}, []int{0, 0, 0}) }, ErrInvalidArgument},
		{"avg pool kernel", func() (*Tensor, error) { return rt.AvgPool3d(x, [3]int{3, 1, 1}, [3]int{1, 1, 1}) }, ErrInvalidArgument},
		{"embedding table", func() (*Tensor, error) { return rt.Embedding(x, ids) }, ErrInvalidArgument},
		{"embedding ids dtype", func() (*Tensor, error) { return rt.Embedding(w, w) }, ErrInvalidArgument},
		{"concat ranks", func() (*Tensor, error) { return rt.Concat(0, x, w) }, ErrInvalidArgument},
		{"upload size", func() (*Tensor, error) { return rt.FromFloat32([]float32{1, 2}, 3) }, ErrInvalidArgument},
		{"nil tensor", func() (*Tensor, error) { return rt.SiLU(nil) }, ErrInvalidArgument},
		{"too many dims", func() (*Tensor, error) { return rt.NewTensor(F32, 1, 1, 1, 1, 1, 1, 1, 1, 1) }, ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			y, err := c.f()
			if err == nil {
				y.Free()
				t.Fatalf("no error")
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}

// TestAllocatorCache: freed large blocks are reused (no new allocation from the system), stay
// within the cap, and are given back when a new allocation needs the room.
func TestAllocatorCache(t *testing.T) {
	const mib = 1 << 20
	rt := newTestRuntime(t, Options{MemoryCap: 10 * mib, CacheLimit: 8 * mib})
	a, err := rt.NewTensor(F32, (3*mib+100)/4) // charged 3 MiB + 64 KiB
	if err != nil {
		t.Fatal(err)
	}
	charged := uint64(3*mib + 64<<10)
	if m := rt.Memory(); m.Allocated != charged {
		t.Fatalf("charged %d, want %d", m.Allocated, charged)
	}
	a.Free()
	if m := rt.Memory(); m.Allocated != 0 || m.Cached != charged {
		t.Fatalf("after free: %+v", m)
	}
	b, err := rt.NewTensor(F32, (3*mib+200)/4) // same charged size: reuses the block
	if err != nil {
		t.Fatal(err)
	}
	if m := rt.Memory(); m.Cached != 0 || m.Allocated != charged {
		t.Fatalf("after reuse: %+v", m)
	}
	b.Free()
	// a different size that fits only without the cached block: the cache is given back
	c, err := rt.NewTensor(F32, 8*mib/4)
	if err != nil {
		t.Fatalf("allocation needing the cached room: %v", err)
	}
	if m := rt.Memory(); m.Cached != 0 || m.Allocated != 8*mib {
		t.Fatalf("after eviction: %+v", m)
	}
	c.Free()
	if err := rt.TrimCache(); err != nil {
		t.Fatal(err)
	}
	if m := rt.Memory(); m.Cached != 0 {
		t.Fatalf("after trim: %+v", m)
	}
}
