package siglip

import (
	"github.com/framepackd/framepackd/internal/nn"
)

// checkpointPrefixes are the names a SiglipVisionModel's tensors may sit under: transformers 5
// saves them bare ("embeddings.…"), transformers 4 and the FLUX Redux checkpoint under the
// vision_model wrapper ("vision_model.embeddings.…").
var checkpointPrefixes = []string{"", "vision_model."}

// Source is a set of named tensors to load a model from: *safetensors.Checkpoint.
type Source = nn.Source
