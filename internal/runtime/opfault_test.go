package runtime

import (
	"errors"
	"sync"
	"testing"
)

// opLog records the events an observer sees.
type opLog struct {
	mu sync.Mutex
	ev []OpEvent
}

func (l *opLog) observe(e OpEvent) {
	l.mu.Lock()
	l.ev = append(l.ev, e)
	l.mu.Unlock()
}

func (l *opLog) events() []OpEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]OpEvent(nil), l.ev...)
}

// TestOpFaultAtSeq: OOMAtOp fails exactly the op with the given sequence number, with a typed
// out of memory that asks for the op's output and reports what the cap leaves; the op's output
// is freed, the ops around it run, and the observer sees the failure on the op's end event.
func TestOpFaultAtSeq(t *testing.T) {
	const cap = 1 << 20
	var log opLog
	rt := newTestRuntime(t, Options{MemoryCap: cap, OpFault: OOMAtOp("", 3), OpObserver: log.observe})
	r := rng(t)
	x, _ := randTensor(t, rt, r, 4, 64) // 1 KiB
	for i := 1; i <= 4; i++ {
		before := rt.Memory().Allocated
		y, err := rt.SiLU(x)
		if i != 3 {
			if err != nil {
				t.Fatalf("op %d: %v", i, err)
			}
			y.Free()
			continue
		}
		var oom *OOMError
		var fe *OpFaultError
		if !errors.As(err, &oom) || !errors.As(err, &fe) || !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("op 3: got %v, want an injected *OOMError", err)
		}
		if fe.Seq != 3 || fe.Op != "silu" || oom.Requested != 1024 || oom.Available != cap-before-1024 {
			t.Fatalf("op 3: %+v %+v (allocated before %d)", fe, oom, before)
		}
		if got := rt.Memory().Allocated; got != before {
			t.Fatalf("the failed op kept %d bytes", got-before)
		}
	}
	ev := log.events()
	if len(ev) != 8 {
		t.Fatalf("%d events, want 8", len(ev))
	}
	for i, e := range ev {
		wantErr := e.Phase == OpEnd && e.Seq == 3
		if (e.Err != nil) != wantErr || e.OutBytes != 1024 || e.Cap != cap {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
}

// TestOpFaultNamed: with a name, the n-th op of that name fails; ops of other names do not
// count. A conv tier attempt that fails by the hook ends the conv (no fall-through to the next
// tier, nothing recorded for the shape).
func TestOpFaultNamed(t *testing.T) {
	rt := newTestRuntime(t, Options{OpFault: OOMAtOp("matmul", 2)})
	r := rng(t)
	a, _ := randTensor(t, rt, r, 3, 4)
	b, _ := randTensor(t, rt, r, 4, 5)
	for i := 1; i <= 3; i++ {
		s, err := rt.SiLU(a) // another name: never counted
		if err != nil {
			t.Fatal(err)
		}
		s.Free()
		y, err := rt.MatMul(a, b, GemmParams{})
		if (err != nil) != (i == 2) {
			t.Fatalf("matmul %d: %v", i, err)
		}
		var oom *OOMError
		if i == 2 && (!errors.As(err, &oom) || oom.Requested != 3*5*4 || oom.Available != 0) {
			t.Fatalf("matmul 2: %v", err)
		}
		y.Free()
	}

	crt := newTestRuntime(t, Options{OpFault: OOMAtOp("conv3d", 1),
		ConvFaults: []ConvFault{{Tier: TierVendorTuned, Mode: FaultServe}}})
	f := newConvFixture(t, crt)
	_, err := crt.Conv3d(f.x, f.w, f.b, f.p)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("conv at its first attempt: got %v, want the injected out of memory", err)
	}
	s := crt.ConvStats()
	if s.Tiers[TierVendorTuned].Failures != 1 || s.Tiers[TierVendorDefault].Attempts != 0 || s.Tiers[TierCPU].Attempts != 0 ||
		s.Failed != 1 || len(crt.chain.local) != 0 {
		t.Fatalf("the injected failure fell through or was recorded: %+v %v", s, crt.chain.local)
	}
	f.run(t, crt) // the next conv is served
}

// TestOpEventBytes: the events carry the allocator's bytes: at begin with the output allocated,
// at end with the op's scratch given back (attention's score chunk, conv's im2col).
func TestOpEventBytes(t *testing.T) {
	var log opLog
	rt := newTestRuntime(t, Options{OpObserver: log.observe})
	r := rng(t)
	q, _ := randTensor(t, rt, r, 1, 2, 64, 16)
	base := rt.Memory().Allocated
	y, err := rt.Attention(q, q, q, nil, AttentionParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer y.Free()
	f := newConvFixture(t, rt)
	base2 := rt.Memory().Allocated
	c, err := rt.Conv3d(f.x, f.w, f.b, f.p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Free()
	ev := log.events()
	if len(ev) != 4 {
		t.Fatalf("%d events: %+v", len(ev), ev)
	}
	out := uint64(y.NumBytes())
	cout := uint64(c.NumBytes())
	for i, want := range []uint64{base + out, base + out, base2 + cout, base2 + cout} {
		if ev[i].Bytes != want {
			t.Errorf("event %d (%s %v): bytes %d, want %d", i, ev[i].Op, ev[i].Phase, ev[i].Bytes, want)
		}
	}
	if ev[2].OutBytes != cout || ev[2].Key == "" {
		t.Errorf("conv event %+v", ev[2])
	}
}
