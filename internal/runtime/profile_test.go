package runtime

import (
	"errors"
	"slices"
	"testing"
)

func TestProfileReportsEveryOp(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	x, err := rt.FromFloat32(make([]float32, 6*8), 6, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	w, err := rt.FromFloat32(make([]float32, 4*8), 4, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Free()
	var got []OpTime
	var nestedErr error
	err = rt.Profile(func() error {
		y, err := rt.Linear(x, w, nil)
		if err != nil {
			return err
		}
		defer y.Free()
		z, err := rt.SiLU(y)
		if err != nil {
			return err
		}
		defer z.Free()
		nestedErr = rt.Profile(func() error { return nil }, func(OpTime) {})
		return z.Fill(1)
	}, func(o OpTime) {
		o.Shape = slices.Clone(o.Shape)
		got = append(got, o)
	})
	if err != nil {
		t.Fatalf("profile: %v", err)
	}
	if !errors.Is(nestedErr, ErrProfiling) {
		t.Errorf("nested profile: got %v, want ErrProfiling", nestedErr)
	}
	want := []struct {
		op    string
		dt    DType
		shape []int
	}{{"linear", F32, []int{6, 4}}, {"silu", F32, []int{6, 4}}, {"fill", AsStored, nil}}
	if len(got) != len(want) {
		t.Fatalf("got %d op times %+v, want %d", len(got), got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Op != w.op || g.DType != w.dt || !slices.Equal(g.Shape, w.shape) || g.Duration <= 0 || g.Err != nil {
			t.Errorf("op %d: got %s %s %v %v err %v, want %s %s %v with a positive duration", i, g.Op, g.DType, g.Shape, g.Duration, g.Err, w.op, w.dt, w.shape)
		}
	}
	// after Profile returns nothing is reported any more
	n := len(got)
	y, err := rt.SiLU(x)
	if err != nil {
		t.Fatal(err)
	}
	y.Free()
	if len(got) != n {
		t.Errorf("op reported after Profile returned")
	}
}
