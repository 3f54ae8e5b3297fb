package runtime

// #include "fpk.h"
import "C"

import (
	"unsafe"
)

// Stream is a queue of device work besides the runtime's own (which every op runs on): block
// streaming copies weights on one while compute runs on the other. On cpu streams run
// synchronously. Free it before the runtime is closed.
type Stream struct {
	rt *Runtime
	h  C.fpk_stream_t
}

// NewStream makes a stream on the runtime's device.
func (rt *Runtime) NewStream() (*Stream, error) {
	var h C.fpk_stream_t
	if err := rt.withBackend("new stream", func() C.fpk_status { return C.fpk_stream_new(rt.be, &h) }); err != nil {
		return nil, err
	}
	return &Stream{rt: rt, h: h}, nil
}

// handle is s's native stream; nil means the runtime's own.
func (s *Stream) handle(rt *Runtime) C.fpk_stream_t {
	if s == nil {
		return rt.stream
	}
	return s.h
}

// Synchronize waits until the stream's queued work has finished.
func (s *Stream) Synchronize() error {
	return s.rt.withBackend("synchronize stream", func() C.fpk_status { return C.fpk_stream_synchronize(s.h) })
}

// Free waits for the stream's work and frees it; a second call does nothing.
func (s *Stream) Free() {
	if s == nil || s.h == nil {
		return
	}
	_ = s.rt.withBackend("free stream", func() C.fpk_status { return C.fpk_stream_free(s.h) })
	s.h = nil
}

// Event marks a point in a stream's work, so another stream (or the host) can wait for it. On
// cpu every event is complete once recorded.
type Event struct {
	rt *Runtime
	h  C.fpk_event_t
}

// NewEvent makes an event on the runtime's device.
func (rt *Runtime) NewEvent() (*Event, error) {
	var h C.fpk_event_t
	if err := rt.withBackend("new event", func() C.fpk_status { return C.fpk_event_new(rt.be, &h) }); err != nil {
		return nil, err
	}
	return &Event{rt: rt, h: h}, nil
}

// Record places the event after the work queued so far on s (nil: the runtime's own stream).
func (e *Event) Record(s *Stream) error {
	return e.rt.withBackend("record event", func() C.fpk_status { return C.fpk_event_record(e.h, s.handle(e.rt)) })
}

// Wait makes work queued on s (nil: the runtime's own stream) from now on wait for the event;
// the host does not wait.
func (e *Event) Wait(s *Stream) error {
	return e.rt.withBackend("wait for event", func() C.fpk_status { return C.fpk_stream_wait_event(s.handle(e.rt), e.h) })
}

// Synchronize makes the host wait for the event.
func (e *Event) Synchronize() error {
	return e.rt.withBackend("synchronize event", func() C.fpk_status { return C.fpk_event_synchronize(e.h) })
}

// Free frees the event; a second call does nothing.
func (e *Event) Free() {
	if e == nil || e.h == nil {
		return
	}
	_ = e.rt.withBackend("free event", func() C.fpk_status { return C.fpk_event_free(e.h) })
	e.h = nil
}

// UploadAsync queues a copy of raw, already in the tensor's dtype, into the tensor on s (nil:
// the runtime's own stream) and returns without waiting on a GPU: raw must stay valid and
// unchanged until s has passed the copy (record an event after it). Pinned memory (PinHost)
// lets the copy overlap other streams' work. On cpu it is Upload.
func (t *Tensor) UploadAsync(s *Stream, raw []byte) error {
	h, err := t.handle("upload async")
	if err != nil {
		return err
	}
	if len(raw) != t.NumBytes() {
		return argError("upload async", "%d bytes for %v of %s (want %d)", len(raw), t.shape, t.dtype, t.NumBytes())
	}
	return t.rt.withBackend("upload async", func() C.fpk_status {
		return C.fpk_tensor_upload_async(s.handle(t.rt), h, unsafe.Pointer(unsafe.SliceData(raw)), C.size_t(len(raw)))
	})
}
