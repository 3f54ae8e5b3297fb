package tokenizer

import (
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
)

// loadFixturePair loads the textenc fixture set's two tokenizers from its model paths.
func loadFixturePair(t testing.TB, fx *parity.Fixture) *PromptTokenizer {
	t.Helper()
	llamaDir, err := fx.ModelPath("tokenizer")
	if err != nil {
		t.Fatal(err)
	}
	clipDir, err := fx.ModelPath("tokenizer_2")
	if err != nil {
		t.Fatal(err)
	}
	p, err := LoadPromptTokenizer(llamaDir, clipDir)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mismatches counts the positions where got and want differ (a length difference counts too).
func mismatches(got []int64, want []int64) int {
	n := max(len(got), len(want)) - min(len(got), len(want))
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			n++
		}
	}
	return n
}

func TestParityTextencTokenize(t *testing.T) {
	fx := parity.Load(t, "textenc")
	p := loadFixturePair(t, fx)
	checked := 0
	for _, c := range fx.Cases {
		if c.Op != "tokenize" {
			t.Logf("case %s: op %s is covered by the text-encoder worker's test", c.Name, c.Op)
			continue
		}
		var prompt string
		c.InputValue(t, "prompt", &prompt)
		var cfg PromptConfig
		if !c.Param(t, "llama_template", &cfg.LlamaTemplate) || !c.Param(t, "llama_max_length", &cfg.LlamaMaxLength) ||
			!c.Param(t, "clip_max_length", &cfg.CLIPMaxLength) {
			t.Fatalf("case %s: params llama_template, llama_max_length and clip_max_length are required", c.Name)
		}
		got, err := p.Encode(prompt, cfg)
		if err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
		total := 0
		for _, out := range []struct {
			name string
			got  []int64
		}{{"llama_ids", got.LlamaIDs}, {"llama_mask", got.LlamaMask}, {"clip_ids", got.CLIPIDs}} {
			want := c.Output(t, out.name)
			if n := int64(len(out.got)); len(want.Shape) == 0 || want.Shape[len(want.Shape)-1] != n {
				t.Errorf("case %s %s: %d ids, want shape %v", c.Name, out.name, n, want.Shape)
			}
			m := mismatches(out.got, want.Ints)
			if m != 0 {
				t.Errorf("case %s %s: %d mismatches\n got %v\nwant %v", c.Name, out.name, m, out.got, want.Ints)
			}
			total += m
		}
		t.Logf("case %s: prompt %d bytes, mismatches=%d", c.Name, len(prompt), total)
		checked++
	}
	if checked == 0 {
		t.Fatal("the textenc fixture has no tokenize case")
	}
}
