package runtime

/*
#cgo CFLAGS: -std=gnu11 -O3 -march=x86-64-v2 -mtune=generic -Wall -Wno-unused-function
#cgo LDFLAGS: -lopenblas -lm -lpthread -ldl
#include <stdlib.h>
#include "fpk.h"
*/
import "C"

import (
	goruntime "runtime"
)

// call runs one C call on a locked OS thread and turns a failed status into a Go error that
// carries the thread-local last-error (message, and sizes for out of memory).
func call(op string, f func() C.fpk_status) error {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	st := f()
	if st == C.FPK_OK {
		return nil
	}
	var info C.fpk_error_info
	C.fpk_last_error_info(&info)
	C.fpk_clear_error()
	msg := C.GoString(&info.message[0])
	return newError(op, Status(st), msg, uint64(info.requested), uint64(info.available))
}
