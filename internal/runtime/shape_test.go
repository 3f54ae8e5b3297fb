package runtime

import "testing"

// The gpu policy of a conv: the NCDHW vendor search's workspace (twice the input and output,
// 16 MiB … 8 GiB) plus a converted weight of another dtype; cuda's 16-bit convs channels-last in
// slabs (the weights transposed, one slab's input and output, half of it as workspace), reading
// the input view in place. The cpu's: an im2col band of at most 32 MiB.
func TestConvScratchPolicy(t *testing.T) {
	p := Conv3dParams{Padding: [3]int{0, 1, 1}}
	x, out := [5]int{1, 128, 9, 272, 352}, [5]int{1, 128, 7, 272, 352}
	w := [5]int{128, 128, 3, 3, 3}
	io := int64(128*9*272*352+128*7*272*352) * 2
	if n, view, err := ConvScratch("hip", p, F16, x, F16, w, F16, out); err != nil || n != 2*io || view {
		t.Errorf("hip 16-bit: %d %v %v, want %d", n, view, err, 2*io)
	}
	if n, _, err := ConvScratch("hip", p, F16, [5]int{1, 4, 1, 8, 8}, F16, [5]int{4, 4, 1, 1, 1}, F16, [5]int{1, 4, 1, 8, 8}); err != nil || n != 16<<20 {
		t.Errorf("small conv: %d %v, want the 16 MiB floor", n, err)
	}
	big := [5]int{1, 512, 17, 544, 704}
	if n, _, _ := ConvScratch("hip", Conv3dParams{Padding: [3]int{1, 1, 1}}, F16, big, F16, [5]int{512, 512, 3, 3, 3}, F16, big); n <= 2<<30 || n > 8<<30 {
		// beyond 32-bit counts the NCDHW path runs in slabs of frames: their workspace, under 8 GiB
		t.Errorf("huge conv: %d, want slabs' scratch under the 8 GiB ceiling", n)
	}
	if n, _, _ := ConvScratch("hip", p, F16, x, F32, w, F16, out); n != 6*io {
		// an f32 weight: the conv computes in f32: x and out converted (2·io), a workspace twice
		// their f32 bytes (4·io)
		t.Errorf("f32 weight: %d", n)
	}
	n, view, err := ConvScratch("cuda", p, F16, x, F16, w, F16, out)
	slab := io // under 1 GiB: one slab
	if want := int64(128*128*27*2) + slab + slab/2; err != nil || n != want || !view {
		t.Errorf("cuda 16-bit: %d %v %v, want %d read in place", n, view, err, want)
	}
	t.Setenv("FRAMEPACK_CUDNN_LAYOUT", "ncdhw")
	if n, view, _ := ConvScratch("cuda", p, F16, x, F16, w, F16, out); n != 2*io || view {
		t.Errorf("cuda ncdhw: %d %v", n, view)
	}
	if n, _, _ := ConvScratch("cpu", p, F32, x, F32, w, F32, out); n != 32<<20/(128*27*352*4)*128*27*352*4 {
		t.Errorf("cpu: %d", n)
	}
}

// A shape-only runtime computes nothing and counts what a forward holds: tensors and the
// policy's conv scratch, transiently.
func TestShapeOnlyRuntime(t *testing.T) {
	rt, err := New(Options{Backend: "hip", ShapeOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	x, err := rt.NewTensor(F16, 1, 128, 9, 272, 352)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	w, err := rt.NewTensor(F16, 128, 128, 3, 3, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Free()
	before := rt.Memory().Allocated
	y, err := rt.Conv3d(x, w, nil, Conv3dParams{Padding: [3]int{1, 1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer y.Free()
	if got := y.Shape(); got[2] != 9 || got[3] != 272 {
		t.Fatalf("shape %v", got)
	}
	m := rt.Memory()
	scratch, _, _ := ConvScratch("hip", Conv3dParams{Padding: [3]int{1, 1, 1}}, F16, [5]int(x.Shape()), F16, [5]int(w.Shape()), F16, [5]int(y.Shape()))
	if m.Allocated-before != uint64(y.NumBytes()) || m.Peak < m.Allocated+uint64(scratch) {
		t.Errorf("allocated %d (output %d), peak %d, scratch %d", m.Allocated-before, y.NumBytes(), m.Peak, scratch)
	}
	if _, err := rt.Conv3d(x, w, nil, Conv3dParams{Padding: [3]int{2, 2, 2}, Stride: [3]int{0, 0, 0}, Groups: 3}); err == nil {
		t.Error("bad groups: no error")
	}
}
