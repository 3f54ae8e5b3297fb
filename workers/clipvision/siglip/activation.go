package siglip

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/runtime"
)

// activationByName returns transformers' ACT2FN[name] for the activations a SigLIP config may
// name (gelu_pytorch_tanh in every released checkpoint).
func activationByName(name string) (runtime.UnaryOp, error) {
	switch name {
	case "gelu_pytorch_tanh", "gelu_new", "gelu_fast":
		return runtime.OpGELUTanh, nil
	case "gelu":
		return runtime.OpGELUErf, nil
	case "quick_gelu":
		return runtime.OpQuickGELU, nil
	case "silu", "swish":
		return runtime.OpSiLU, nil
	}
	return 0, fmt.Errorf("hidden_act %q is not supported (gelu_pytorch_tanh, gelu_new, gelu_fast, gelu, quick_gelu, silu, swish)", name)
}
