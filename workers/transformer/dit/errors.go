package dit

import (
	"errors"
	"fmt"

	"github.com/framepackd/framepackd/internal/nn"
)

// Errors callers act on. Bad requests (shapes, indices, NaN inputs, batch > 1) match
// ErrInvalidInput; a config.json this package cannot run matches ErrUnsupportedConfig; a checkpoint
// that lacks a tensor or holds one of the wrong shape matches ErrBadCheckpoint.
var (
	// ErrInvalidInput: the forward's inputs are inconsistent or not finite; retrying will not help.
	ErrInvalidInput = errors.New("invalid input")
	// ErrUnsupportedConfig: the model config asks for something this implementation does not do.
	ErrUnsupportedConfig = errors.New("unsupported config")
	// ErrBadCheckpoint: a weight is missing or has the wrong shape (the shared loader's
	// nn.ErrCheckpoint).
	ErrBadCheckpoint = nn.ErrCheckpoint
	// ErrNonFinite: the model produced NaN or Inf from finite inputs.
	ErrNonFinite = errors.New("non-finite output")
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidInput}, args...)...)
}
