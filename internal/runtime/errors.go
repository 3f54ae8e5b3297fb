package runtime

import (
	"errors"
	"fmt"
)

// Status is a status code of the native runtime's C ABI.
type Status int

// Status codes (fpk_status in native/include/fpk.h).
const (
	StatusOK              Status = 0
	StatusInvalidArgument Status = 1
	StatusOutOfMemory     Status = 2
	StatusUnsupported     Status = 3
	StatusUnavailable     Status = 4
	StatusBackend         Status = 5
	StatusDeviceLost      Status = 6
	StatusInternal        Status = 7
)

// String returns the status's name.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusInvalidArgument:
		return "invalid argument"
	case StatusOutOfMemory:
		return "out of memory"
	case StatusUnsupported:
		return "unsupported"
	case StatusUnavailable:
		return "unavailable"
	case StatusBackend:
		return "backend error"
	case StatusDeviceLost:
		return "device lost"
	case StatusInternal:
		return "internal error"
	}
	return fmt.Sprintf("status %d", int(s))
}

// Sentinel errors for errors.Is; every error of this package that comes from the native
// runtime matches the one of its status.
var (
	// ErrOutOfMemory: an allocation went over the memory cap (or the device refused it).
	ErrOutOfMemory = errors.New("out of memory")
	// ErrInvalidArgument: a bad shape, dtype or parameter.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUnsupported: the backend does not implement the op for these dtypes.
	ErrUnsupported = errors.New("unsupported")
	// ErrUnavailable: a conv tier or vendor library the backend does not have.
	ErrUnavailable = errors.New("unavailable")
	// ErrBackend: a vendor library call failed.
	ErrBackend = errors.New("backend error")
	// ErrDeviceLost: the device stopped answering; the worker should exit.
	ErrDeviceLost = errors.New("device lost")
	// ErrInternal: a bug in the runtime.
	ErrInternal = errors.New("internal error")
	// ErrFreed: a tensor was used after Free.
	ErrFreed = errors.New("tensor used after free")
	// ErrClosed: the runtime was used after Close.
	ErrClosed = errors.New("runtime closed")
	// ErrNoConvTier: every tier of the conv fallback chain failed, was unavailable or skipped.
	ErrNoConvTier = errors.New("no conv tier could serve the shape")
)

func (s Status) sentinel() error {
	switch s {
	case StatusInvalidArgument:
		return ErrInvalidArgument
	case StatusOutOfMemory:
		return ErrOutOfMemory
	case StatusUnsupported:
		return ErrUnsupported
	case StatusUnavailable:
		return ErrUnavailable
	case StatusBackend:
		return ErrBackend
	case StatusDeviceLost:
		return ErrDeviceLost
	}
	return ErrInternal
}

// Error is a failed native runtime call.
type Error struct {
	Op     string // the runtime op ("conv3d", "tensor new")
	Status Status
	Msg    string // the runtime's message
}

// Error implements error.
func (e *Error) Error() string { return e.Op + ": " + e.Msg }

// Is matches the sentinel of the error's status.
func (e *Error) Is(target error) bool { return target == e.Status.sentinel() }

// OOMError is an allocation over the memory cap: callers retry with a smaller footprint.
// errors.Is(err, ErrOutOfMemory) holds for it.
type OOMError struct {
	Op        string
	Requested uint64 // bytes asked for
	Available uint64 // bytes left under the cap when it was asked
	Msg       string
}

// Error implements error.
func (e *OOMError) Error() string {
	return fmt.Sprintf("%s: out of memory: requested %d bytes, %d available (%s)", e.Op, e.Requested,
		e.Available, e.Msg)
}

// Is matches ErrOutOfMemory.
func (e *OOMError) Is(target error) bool { return target == ErrOutOfMemory }

func newError(op string, st Status, msg string, requested, available uint64) error {
	if st == StatusOutOfMemory {
		return &OOMError{Op: op, Requested: requested, Available: available, Msg: msg}
	}
	return &Error{Op: op, Status: st, Msg: msg}
}

// argError is a bad argument found on the Go side (before any C call).
func argError(op, format string, args ...any) error {
	return &Error{Op: op, Status: StatusInvalidArgument, Msg: fmt.Sprintf(format, args...)}
}
