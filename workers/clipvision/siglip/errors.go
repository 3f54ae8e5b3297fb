package siglip

import (
	"errors"

	"github.com/framepackd/framepackd/internal/nn"
)

// ErrBadInput is wrapped by errors caused by the caller's input (an image of the wrong rank or
// channel count, an empty image, pixel values of the wrong shape); workers answer it with
// InvalidArgument.
var ErrBadInput = errors.New("bad input")

// ErrCheckpoint is wrapped by load errors about the checkpoint's tensors (missing, wrong shape,
// unsupported dtype: the shared loader's nn.ErrCheckpoint) and about the configs.
var ErrCheckpoint = nn.ErrCheckpoint
