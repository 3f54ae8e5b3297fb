package imageproc

import (
	"errors"
	"fmt"
)

// ErrBadImage is the class of every error caused by the input image itself (as opposed to the
// machine): callers answer it with "invalid argument" and do not retry. Every Err* below is one.
var ErrBadImage = errors.New("bad image")

// Kinds of bad input. Test with errors.Is; each also matches ErrBadImage.
var (
	// ErrEmpty: no bytes at all.
	ErrEmpty = fmt.Errorf("%w: empty input", ErrBadImage)
	// ErrUnknownFormat: the bytes are none of PNG, JPEG, WebP.
	ErrUnknownFormat = fmt.Errorf("%w: unknown format (want png, jpeg or webp)", ErrBadImage)
	// ErrFormatMismatch: the caller declared one format and the bytes are another.
	ErrFormatMismatch = fmt.Errorf("%w: content does not match the declared format", ErrBadImage)
	// ErrZeroSize: a width or height of zero.
	ErrZeroSize = fmt.Errorf("%w: zero size", ErrBadImage)
	// ErrTooLarge: more pixels (or bytes) than the configured limit; refused before decoding.
	ErrTooLarge = fmt.Errorf("%w: too large", ErrBadImage)
	// ErrTruncated: the data ends before the image does.
	ErrTruncated = fmt.Errorf("%w: truncated", ErrBadImage)
	// ErrCorrupt: malformed data.
	ErrCorrupt = fmt.Errorf("%w: corrupt", ErrBadImage)
	// ErrUnsupported: a valid file using a feature this decoder lacks (e.g. animated WebP).
	ErrUnsupported = fmt.Errorf("%w: unsupported", ErrBadImage)
)

// DecodeError describes why an image could not be decoded. errors.Is matches its Kind (one of the
// Err* values above, hence ErrBadImage too) and its underlying cause.
type DecodeError struct {
	Format Format // detected format, "" if unknown
	Kind   error  // one of ErrEmpty, ErrUnknownFormat, …
	// Width and Height are the declared size when known (set for ErrTooLarge and ErrZeroSize).
	Width, Height int
	Err           error // the cause, may be nil
}

// Error describes the failure: format, kind, declared size when known, cause.
func (e *DecodeError) Error() string {
	s := "decode image"
	if e.Format != "" {
		s += " (" + string(e.Format) + ")"
	}
	s += ": " + e.Kind.Error()
	if e.Width != 0 || e.Height != 0 {
		s += fmt.Sprintf(" (%dx%d)", e.Width, e.Height)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the kind and the cause.
func (e *DecodeError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

func decodeErr(f Format, kind, cause error) *DecodeError {
	return &DecodeError{Format: f, Kind: kind, Err: cause}
}
