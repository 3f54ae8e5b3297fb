package nn

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// stagingTensor is one tensor of stagingCheckpoint: name, checkpoint dtype, shape.
type stagingTensor struct {
	name  string
	dtype safetensors.DType
	shape []int64
}

// stagingTensors mixes dtypes and sizes: with a 256-byte slot, several small tensors share a
// slot, some fill one exactly, some are larger (uploaded by LoadTensor) and the ring of two
// slots wraps around many times.
var stagingTensors = []stagingTensor{
	{"a.weight", safetensors.F32, []int64{4, 4}},        // 64 bytes
	{"a.bias", safetensors.F32, []int64{4}},             // 16
	{"b.weight", safetensors.BF16, []int64{8, 16}},      // 256: a whole slot
	{"b.bias", safetensors.BF16, []int64{8}},            // 16
	{"c.weight", safetensors.F16, []int64{16, 16}},      // 512: larger than a slot
	{"c.bias", safetensors.F16, []int64{16}},            // 32
	{"d.weight", safetensors.F32, []int64{3, 5, 2}},     // 120: odd sizes, realigned
	{"d.bias", safetensors.BF16, []int64{3}},            // 6
	{"e.weight", safetensors.F32, []int64{33, 2}},       // 264: just larger than a slot
	{"e.bias", safetensors.F16, []int64{1}},             // 2
	{"f.weight", safetensors.BF16, []int64{2, 3, 4, 5}}, // 240
	{"f.bias", safetensors.F32, []int64{60}},            // 240
}

// stagingCheckpoint writes stagingTensors with random bits (every bit pattern a half can
// hold, NaNs included: a staged copy moves bytes, it does not convert) and opens it.
func stagingCheckpoint(t *testing.T) *safetensors.Checkpoint {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 11))
	var ts []safetensors.Tensor
	for _, st := range stagingTensors {
		n := st.dtype.Size()
		for _, d := range st.shape {
			n *= int(d)
		}
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		if st.dtype == safetensors.F32 { // finite f32 values: conversions to 16 bits stay defined
			for i := 3; i < n; i += 4 {
				data[i] &= 0x3f
			}
		}
		ts = append(ts, safetensors.Tensor{Name: st.name, DType: st.dtype, Shape: st.shape, Data: data})
	}
	return checkpoint(t, ts...)
}

// bindStagingTensors binds every tensor of stagingTensors: weights with Weight, biases with
// Tensor.
func bindStagingTensors(l *Loader) []*runtime.Tensor {
	var out []*runtime.Tensor
	for _, st := range stagingTensors {
		shape := make([]int, len(st.shape))
		for i, d := range st.shape {
			shape[i] = int(d)
		}
		if strings.HasSuffix(st.name, ".weight") {
			out = append(out, l.Weight(st.name, shape...))
		} else {
			out = append(out, l.Tensor(st.name, shape...))
		}
	}
	return out
}

// TestStagedUploadBitIdentical loads the same checkpoint with and without staging, for
// several dtype options and slot sizes, and compares every tensor's dtype and bytes; the
// staged bytes are exactly the tensors already in their target dtype that fit a slot, and
// Finish leaves the ring freed.
func TestStagedUploadBitIdentical(t *testing.T) {
	rt := newRuntime(t)
	ck := stagingCheckpoint(t)
	options := []Options{
		{DType: runtime.F32, WeightDType: runtime.AsStored},
		{DType: runtime.F32, WeightDType: runtime.BF16},
		{DType: runtime.F16, WeightDType: runtime.F16},
		{DType: runtime.BF16},
	}
	for _, o := range options {
		plain := NewLoader(rt, ck, o, "model.")
		plain.SetStaging(Staging{})
		want := bindStagingTensors(plain)
		wantW, _, err := plain.Finish()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []Staging{{Slots: 2, SlotBytes: 256}, {Slots: 3, SlotBytes: 100}, {Slots: 1, SlotBytes: 1000}, {Slots: DefaultStagingSlots, SlotBytes: DefaultStagingSlotBytes}} {
			what := fmt.Sprintf("dtype %s weights %s, %d slots of %d bytes", o.DType, o.WeightDType, s.Slots, s.SlotBytes)
			l := NewLoader(rt, ck, o, "model.")
			l.SetStaging(s)
			got := bindStagingTensors(l)
			ring := l.ring
			var wantStaged int64
			for i, st := range stagingTensors {
				target := o.DType
				if strings.HasSuffix(st.name, ".weight") && o.WeightDType != 0 {
					target = o.WeightDType
				}
				sdt := runtime.StoredDType(st.dtype)
				if (target == runtime.AsStored || target == sdt) && got[i].NumBytes() <= s.SlotBytes {
					wantStaged += int64(got[i].NumBytes())
				}
			}
			if wantStaged > 0 && ring == nil {
				t.Fatalf("%s: %d bytes to stage and no ring", what, wantStaged)
			}
			ws, rep, err := l.Finish()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if l.ring != nil || (ring != nil && (ring.host != nil || ring.copy != nil || ring.slots != nil)) {
				t.Errorf("%s: Finish left the ring %+v", what, ring)
			}
			if rep.StagedBytes != wantStaged || ws.StagedBytes() != wantStaged || ws.WeightBytes() != wantW.WeightBytes() {
				t.Errorf("%s: staged %d (weights say %d) of %d bytes, want %d of %d", what, rep.StagedBytes, ws.StagedBytes(), ws.WeightBytes(), wantStaged, wantW.WeightBytes())
			}
			for i, st := range stagingTensors {
				if got[i].DType() != want[i].DType() {
					t.Fatalf("%s: %s is %s, unstaged %s", what, st.name, got[i].DType(), want[i].DType())
				}
				g, err := got[i].Bytes()
				if err != nil {
					t.Fatal(err)
				}
				w, err := want[i].Bytes()
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(g, w) {
					t.Errorf("%s: %s differs from its unstaged upload", what, st.name)
				}
			}
			ws.Free()
		}
		wantW.Free()
	}
	if live := rt.Memory().LiveTensors; live != 0 {
		t.Errorf("%d tensors left alive", live)
	}
}

// truncatingSource is a checkpoint whose tensor bad reads short (a checkpoint truncated under
// the loader) or fails outright.
type truncatingSource struct {
	*safetensors.Checkpoint
	bad  string
	fail bool
}

func (s truncatingSource) Bytes(name string) ([]byte, error) {
	raw, err := s.Checkpoint.Bytes(name)
	if err != nil || name != s.bad {
		return raw, err
	}
	if s.fail {
		return nil, errors.New("read past the end of the file")
	}
	return raw[:len(raw)/2], nil
}

// TestStagedUploadTruncated: a tensor that cannot be read midway through a staged load fails
// it with a checkpoint error naming the tensor; Finish frees the ring and every tensor
// uploaded before it, and nothing after it is uploaded.
func TestStagedUploadTruncated(t *testing.T) {
	rt := newRuntime(t)
	ck := stagingCheckpoint(t)
	for _, fail := range []bool{false, true} {
		src := truncatingSource{Checkpoint: ck, bad: "model.d.weight", fail: fail}
		l := NewLoader(rt, src, Options{DType: runtime.F32, WeightDType: runtime.AsStored}, "model.")
		l.SetStaging(Staging{Slots: 2, SlotBytes: 256})
		got := bindStagingTensors(l)
		ring := l.ring
		if ring == nil || l.StagedBytes() == 0 {
			t.Fatalf("fail %v: nothing was staged before the bad tensor", fail)
		}
		for i, st := range stagingTensors[6:] { // d.weight and everything after it
			if got[6+i] != nil {
				t.Errorf("fail %v: %s was uploaded after the bad tensor", fail, st.name)
			}
		}
		_, _, err := l.Finish()
		var te *TensorError
		if !errors.Is(err, ErrCheckpoint) || !errors.As(err, &te) || te.Name != "model.d.weight" {
			t.Fatalf("fail %v: %v, want a checkpoint error about model.d.weight", fail, err)
		}
		if l.ring != nil || ring.host != nil || ring.copy != nil {
			t.Errorf("fail %v: the ring was not freed", fail)
		}
		if live := rt.Memory().LiveTensors; live != 0 {
			t.Errorf("fail %v: %d tensors left alive after a failed load", fail, live)
		}
	}
}

// TestStagedUploadRingFails: SetStaging with other slots closes the ring made for the old
// ones; a ring that cannot be made (more host memory than the address space holds) fails the
// load with a staged-upload error, not a checkpoint one, and frees everything.
func TestStagedUploadRingFails(t *testing.T) {
	rt := newRuntime(t)
	ck := stagingCheckpoint(t)
	l := NewLoader(rt, ck, Options{DType: runtime.F32, WeightDType: runtime.AsStored}, "model.")
	l.SetStaging(Staging{Slots: 2, SlotBytes: 64})
	l.Tensor("a.bias", 4) // staged through a ring of small slots, closed by the next SetStaging
	if l.ring == nil || l.StagedBytes() != 16 {
		t.Fatalf("a.bias: ring %v, %d bytes staged", l.ring, l.StagedBytes())
	}
	l.SetStaging(Staging{Slots: 4, SlotBytes: 1 << 60})
	if l.ring != nil {
		t.Fatal("SetStaging kept the ring of other slots")
	}
	l.Tensor("f.bias", 60)
	_, _, err := l.Finish()
	if !errors.Is(err, errStaging) || errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), "model.f.bias") {
		t.Fatalf("%v, want a staged-upload error about model.f.bias", err)
	}
	if live := rt.Memory().LiveTensors; live != 0 {
		t.Errorf("%d tensors left alive after a failed load", live)
	}
}

// TestStagingFromEnv: FRAMEPACK_STAGED_UPLOAD switches staging when it reads as a bool; unset
// or unreadable, staging is on for a device backend and off for a host one (the cpu backend);
// the slot size comes from FRAMEPACK_STAGED_UPLOAD_SLOT_BYTES when it is a positive number;
// NewLoader takes it (the cpu runtime, or none: off by default), and a host copy is never
// staged.
func TestStagingFromEnv(t *testing.T) {
	on := Staging{Slots: DefaultStagingSlots, SlotBytes: DefaultStagingSlotBytes}
	for _, c := range []struct {
		on, slot   string
		host, want Staging // on a host backend; on a device backend
	}{
		{"", "", Staging{}, on},
		{"0", "4096", Staging{}, Staging{}},
		{"false", "", Staging{}, Staging{}},
		{"yes", "", Staging{}, on},
		{"1", "", on, on},
		{"true", "4096", Staging{Slots: DefaultStagingSlots, SlotBytes: 4096}, Staging{Slots: DefaultStagingSlots, SlotBytes: 4096}},
		{"1", "-5", on, on},
	} {
		t.Setenv(EnvStagedUpload, c.on)
		t.Setenv(EnvStagedUploadSlotBytes, c.slot)
		if got := StagingFromEnv(true); got != c.host {
			t.Errorf("%q, slot %q, host backend: %+v, want %+v", c.on, c.slot, got, c.host)
		}
		if got := StagingFromEnv(false); got != c.want {
			t.Errorf("%q, slot %q, device backend: %+v, want %+v", c.on, c.slot, got, c.want)
		}
		if got := NewLoader(nil, nil, Options{}, "").staging; got != c.host {
			t.Errorf("%q, slot %q: a new loader without a runtime stages %+v, want %+v", c.on, c.slot, got, c.host)
		}
		if got := NewLoader(newRuntime(t), nil, Options{}, "").staging; got != c.host {
			t.Errorf("%q, slot %q: a new loader on the cpu stages %+v, want %+v", c.on, c.slot, got, c.host)
		}
	}
	rt := newRuntime(t)
	ck := stagingCheckpoint(t)
	t.Setenv(EnvStagedUpload, "1")
	l := NewLoader(rt, ck, Options{DType: runtime.F32, WeightDType: runtime.AsStored}, "model.")
	h := l.BeginHost("")
	bindStagingTensors(l)
	l.EndHost()
	if _, _, err := l.Finish(); err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	hl := NewLoader(rt, h, Options{DType: runtime.AsStored, WeightDType: runtime.AsStored}, "")
	bindStagingTensors(hl)
	ws, _, err := hl.Finish()
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Free()
	if l.StagedBytes() != 0 || ws.StagedBytes() != 0 {
		t.Errorf("host binds staged %d bytes, the host copy's loader %d; want none", l.StagedBytes(), ws.StagedBytes())
	}
}
