package tokenizer

import (
	"errors"
	"strings"
	"testing"
)

func TestLoadRefusesUnknownComponents(t *testing.T) {
	tests := []struct {
		name string
		spec miniSpec
		want string // must appear in the error
	}{
		{"wordpiece model", miniSpec{Model: map[string]any{"type": "WordPiece"}}, `model type "WordPiece"`},
		{"unigram model", miniSpec{Model: map[string]any{"type": "Unigram"}}, `model type "Unigram"`},
		{"wordlevel model", miniSpec{Model: map[string]any{"type": "WordLevel"}}, `model type "WordLevel"`},
		{"bert normalizer", miniSpec{Normalizer: map[string]any{"type": "BertNormalizer"}}, `normalizer "BertNormalizer"`},
		{"nested precompiled normalizer", miniSpec{Normalizer: map[string]any{"type": "Sequence",
			"normalizers": []any{map[string]any{"type": "NFC"}, map[string]any{"type": "Precompiled"}}}}, `normalizer "Precompiled"`},
		{"metaspace pre-tokenizer", miniSpec{Pre: map[string]any{"type": "Metaspace"}}, `pre-tokenizer "Metaspace"`},
		{"whitespace pre-tokenizer in sequence", miniSpec{Pre: map[string]any{"type": "Sequence",
			"pretokenizers": []any{map[string]any{"type": "WhitespaceSplit"}}}}, `pre-tokenizer "WhitespaceSplit"`},
		{"split before byte level is fine, after is not", miniSpec{Pre: map[string]any{"type": "Sequence",
			"pretokenizers": []any{byteLevelPreJSON, map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Isolated"}}}},
			`pre-tokenizer "Split" after ByteLevel`},
		{"unknown split behavior", miniSpec{Pre: map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Sideways"}}, `split behavior "Sideways"`},
		{"bad split regex", miniSpec{Pre: map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(unclosed"}, "behavior": "Isolated"}}, `regex "(unclosed"`},
		{"unknown post-processor", miniSpec{Post: map[string]any{"type": "BertishProcessing"}}, `post-processor "BertishProcessing"`},
		{"unknown post-processor in sequence", miniSpec{Post: map[string]any{"type": "Sequence",
			"processors": []any{map[string]any{"type": "ByteLevel"}, map[string]any{"type": "Mystery"}}}}, `post-processor "Mystery"`},
		{"dropout", miniSpec{Model: map[string]any{"dropout": 0.1}}, "dropout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseJSON(tc.spec.json(t))
			if !errors.Is(err, ErrUnsupported) {
				t.Fatalf("err = %v, want ErrUnsupported", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %q, want it to name %s", err, tc.want)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name string
		data string
		want string
	}{
		{"empty", "", "want '{'"},
		{"not json", "hello", "want '{'"},
		{"truncated", `{"model": {"type": "BPE", "vocab": {"a": 0`, "end of input"},
		{"no model", `{"version": "1.0"}`, "no model"},
		{"no vocab", `{"model": {"type": "BPE", "merges": []}}`, "no vocab"},
		{"negative id", `{"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}}`, "non-negative integer"},
		{"float id", `{"model": {"type": "BPE", "vocab": {"a": 1.5}, "merges": []}}`, "want an integer"},
		{"merge of unknown token", `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a c"]}}`, `token "c" is not in the vocabulary`},
		{"merge result unknown", `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]}}`, `merged token "ab"`},
		{"merge with three parts", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a a"]}}`, "two tokens"},
		{"unk not in vocab", `{"model": {"type": "BPE", "unk_token": "<unk>", "vocab": {"a": 0}, "merges": []}}`, `unk_token "<unk>"`},
		{"trailing data", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}} x`, "data after"},
		{"control character in string", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\x01\": 0}, \"merges\": []}}", "control character"},
		{"deep nesting", `{"x": ` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`, "nested too deeply"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseJSON([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadDirErrors(t *testing.T) {
	if _, err := LoadDir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no tokenizer.json") {
		t.Errorf("empty folder: err = %v", err)
	}
	dir := writeDir(t, map[string][]byte{
		"vocab.json": []byte(`{"a": 0}`), "merges.txt": []byte("#version: 0.2\n"),
		"tokenizer_config.json": []byte(`{"tokenizer_class": "GPT2Tokenizer"}`),
	})
	if _, err := LoadDir(dir); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "GPT2Tokenizer") {
		t.Errorf("vocab.json of a GPT-2 tokenizer: err = %v, want ErrUnsupported naming the class", err)
	}
	dir = writeDir(t, map[string][]byte{
		"vocab.json": []byte(`{"a": 0, "<|startoftext|>": 1, "<|endoftext|>": 2}`), "merges.txt": []byte("#version: 0.2\na  a\n"),
	})
	if _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad merges.txt line: err = %v", err)
	}
	dir = writeDir(t, map[string][]byte{"tokenizer.json": []byte(`{`), "tokenizer_config.json": []byte(`{"pad_token": 3}`)})
	if _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Errorf("bad tokenizer_config.json: err = %v", err)
	}
}

func TestUnknownDecoderFailsOnlyDecode(t *testing.T) {
	tok := miniSpec{Pre: byteLevelPreJSON, Decoder: map[string]any{"type": "Fuse"}}.parse(t)
	enc, err := tok.Encode("hi", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tok.Decode(enc.IDs, false); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), `"Fuse"`) {
		t.Errorf("decode err = %v, want ErrUnsupported naming Fuse", err)
	}
}

func TestMergesFormats(t *testing.T) {
	// Legacy "a b" strings and [a, b] pairs load the same merges.
	legacy := `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\"": 3, "a\"": 4}, "merges": ["a b", "a \""]}}`
	pairs := `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\"": 3, "a\"": 4}, "merges": [["a", "b"], ["a", "\""]]}}`
	for _, doc := range []string{legacy, pairs} {
		tok, err := ParseJSON([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		enc, err := tok.Encode(`aba"`, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if want := []int64{2, 4}; !equalIDs(enc.IDs, want) {
			t.Errorf("%s: ids %v, want %v", doc, enc.IDs, want)
		}
	}
}

func TestLoadCLIPConfig(t *testing.T) {
	p := fixtureTokenizers(t)
	pad, ok := p.CLIP.PadID()
	if !ok || pad != 703 {
		t.Errorf("CLIP pad id = %d, %v; want <|endoftext|> = 703 (tokenizer_config.json)", pad, ok)
	}
	if got := p.CLIP.ModelMaxLength(); got != 77 {
		t.Errorf("CLIP model_max_length = %d, want 77", got)
	}
	if pad, _ := p.Llama.PadID(); pad != 128001 {
		t.Errorf("Llama pad id = %d, want <|end_of_text|> = 128001", pad)
	}
	if got := p.Llama.SpecialTokenCount(); got != 1 {
		t.Errorf("Llama adds %d special tokens, want 1 (BOS)", got)
	}
	if got := p.Llama.VocabSize(); got != 128256 {
		t.Errorf("Llama vocab size %d, want 128256", got)
	}
}

func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
