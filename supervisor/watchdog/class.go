package watchdog

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// Class is how one stage attempt ended.
type Class int

// Attempt classes (ARCHITECTURE.md §6). Cancelled is not a failure: the job was cancelled or
// the daemon stops; it is never retried and never counted against a budget.
const (
	ClassOK Class = iota
	ClassOOM
	ClassHang
	ClassCrash
	ClassDeviceLost
	ClassBadInput
	ClassCancelled
	numClasses
)

var classNames = [numClasses]string{"ok", "oom", "hang", "crash", "device-lost", "bad-input", "cancelled"}

// String returns the class's name ("oom", "device-lost").
func (c Class) String() string {
	if c >= 0 && c < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// Classes lists every class, in order.
func Classes() []Class {
	out := make([]Class, numClasses)
	for i := range out {
		out[i] = Class(i)
	}
	return out
}

// Proto returns the class as the public API's AttemptClass (UNSPECIFIED for Cancelled, which
// the API never reports as an attempt).
func (c Class) Proto() framepackv1.AttemptClass {
	switch c {
	case ClassOK:
		return framepackv1.AttemptClass_ATTEMPT_CLASS_OK
	case ClassOOM:
		return framepackv1.AttemptClass_ATTEMPT_CLASS_OOM
	case ClassHang:
		return framepackv1.AttemptClass_ATTEMPT_CLASS_HANG
	case ClassCrash:
		return framepackv1.AttemptClass_ATTEMPT_CLASS_CRASH
	case ClassDeviceLost:
		return framepackv1.AttemptClass_ATTEMPT_CLASS_DEVICE_LOST
	case ClassBadInput:
		return framepackv1.AttemptClass_ATTEMPT_CLASS_BAD_INPUT
	}
	return framepackv1.AttemptClass_ATTEMPT_CLASS_UNSPECIFIED
}

// Retryable reports whether an attempt of this class may be tried again.
func (c Class) Retryable() bool {
	switch c {
	case ClassOOM, ClassHang, ClassCrash, ClassDeviceLost:
		return true
	}
	return false
}

// NeedsProbe reports whether the device must pass a probe before the next attempt.
func (c Class) NeedsProbe() bool { return c == ClassCrash || c == ClassDeviceLost }

// Classify decides how an attempt ended from its error (nil on success) and the watchdog's
// verdict (nil when the watchdog saw nothing wrong), and says why in a short lower-case line.
//
// Order matters: a result is a success whatever the watchdog saw afterwards; a hang verdict
// explains the error the kill caused; then the worker's own classified error; then how the
// process died; a cancelled context last (its transport error is not the worker's fault).
func Classify(ctx context.Context, err error, v *Verdict) (Class, string) {
	c, why := classify(ctx, err, v)
	if why == "" && c != ClassOK {
		why = c.String() // an error without a message
	}
	return c, why
}

func classify(ctx context.Context, err error, v *Verdict) (Class, string) {
	if err == nil {
		return ClassOK, ""
	}
	if v != nil && v.Kind.IsHang() {
		return ClassHang, v.String()
	}
	if ctx != nil && ctx.Err() != nil {
		return ClassCancelled, fmt.Sprintf("cancelled: %v", context.Cause(ctx))
	}
	var we *workerkit.Error
	if errors.As(err, &we) {
		switch we.Code {
		case workerkit.CodeOutOfMemory:
			return ClassOOM, err.Error()
		case workerkit.CodeDeviceLost:
			return ClassDeviceLost, err.Error()
		case workerkit.CodeInvalidArgument:
			return ClassBadInput, err.Error()
		case workerkit.CodeCancelled:
			// The worker saw its call cancelled while our context is alive: the call's
			// deadline ran out, which only a stuck stage does.
			return ClassHang, err.Error()
		}
		return ClassCrash, err.Error() // an internal error of the worker
	}
	var ee *workerkit.ExitError
	if errors.As(err, &ee) {
		for _, line := range ee.Stderr {
			if deviceLostLine(line) {
				return ClassDeviceLost, err.Error()
			}
		}
		return ClassCrash, err.Error()
	}
	if v != nil && v.Kind == VerdictExited {
		return ClassCrash, v.String() + ": " + err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ClassHang, err.Error()
	}
	return ClassCrash, err.Error()
}

// deviceLostMarks are what a worker that died of a lost device tends to write last: our
// runtime's own status name, and the vendor runtimes' names for a device that stopped
// answering.
var deviceLostMarks = []string{"device lost", "cuda_error_illegal_address", "cudaerrorillegaladdress",
	"cudaerrorlaunchfailure", "hiperrorlaunchfailure", "hiperrornodevice", "hsa_status_error_exception",
	"gpu hang", "nvrm: xid"}

func deviceLostLine(line string) bool {
	l := strings.ToLower(line)
	for _, m := range deviceLostMarks {
		if strings.Contains(l, m) {
			return true
		}
	}
	return false
}
