package tokenizer_test

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/tokenizer"
)

// The text-encoder worker's use: load both tokenizers once from the HunyuanVideo folder, then
// tokenise each prompt (and the empty negative prompt when CFG is on).
func ExamplePromptTokenizer_Encode() {
	modelDir := "/models/hunyuanvideo" // the worker's Load request names it
	tok, err := tokenizer.LoadPromptTokenizer(filepath.Join(modelDir, "tokenizer"), filepath.Join(modelDir, "tokenizer_2"))
	if err != nil {
		fmt.Println(err) // a missing file, or ErrUnsupported naming the component
		return
	}
	cfg := tokenizer.DefaultPromptConfig() // HunyuanTemplate, 256+95 Llama ids, 77 CLIP ids
	ids, err := tok.Encode("The girl dances gracefully, with clear movements, full of charm.", cfg)
	if errors.Is(err, tokenizer.ErrInvalidPrompt) {
		fmt.Println("InvalidArgument:", err) // not UTF-8
		return
	}
	// ids.LlamaIDs and ids.LlamaMask ([351] int64) go to the Llama model, which keeps
	// hidden_states[-3][:, HunyuanCropStart:attended]; ids.CLIPIDs ([77] int64) go to CLIP-L.
	fmt.Println(len(ids.LlamaIDs), len(ids.LlamaMask), len(ids.CLIPIDs))
}
