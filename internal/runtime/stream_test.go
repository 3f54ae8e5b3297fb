package runtime

import (
	"bytes"
	"errors"
	"testing"
)

// TestStreamsAndEvents: a copy queued on a second stream with UploadAsync, ordered before the
// runtime's own stream by an event, lands bit for bit; events record, wait and synchronize on
// either stream; a source of the wrong size is refused.
func TestStreamsAndEvents(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	copyStream, err := rt.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer copyStream.Free()
	ready, err := rt.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ready.Free()
	for _, dt := range []DType{F32, F16, BF16} {
		src, err := rt.FromFloat32([]float32{1.5, -2.25, 3e-3, 65504, 0.1, -7}, 2, 3)
		if err != nil {
			t.Fatal(err)
		}
		want, err := rt.Cast(src, dt)
		src.Free()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := want.Bytes()
		want.Free()
		if err != nil {
			t.Fatal(err)
		}
		slot, err := rt.NewTensor(dt, 2, 3)
		if err != nil {
			t.Fatal(err)
		}
		if err := slot.UploadAsync(copyStream, raw); err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		if err := ready.Record(copyStream); err != nil {
			t.Fatal(err)
		}
		if err := ready.Wait(nil); err != nil {
			t.Fatal(err)
		}
		got, err := slot.Bytes() // on the runtime's own stream, after the event
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, raw) {
			t.Errorf("%s: slot holds % x, uploaded % x", dt, got, raw)
		}
		if err := slot.UploadAsync(nil, raw[:len(raw)-1]); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: short source: %v, want ErrInvalidArgument", dt, err)
		}
		slot.Free()
	}
	if err := ready.Record(nil); err != nil {
		t.Fatal(err)
	}
	if err := ready.Wait(copyStream); err != nil {
		t.Fatal(err)
	}
	if err := ready.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := copyStream.Synchronize(); err != nil {
		t.Fatal(err)
	}
}
