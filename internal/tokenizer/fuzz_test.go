package tokenizer

import (
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/framepackd/framepackd/internal/parity"
)

// FuzzLlamaEncode: no input panics; invalid UTF-8 is refused with ErrInvalidPrompt; for valid
// UTF-8, decode(encode(x)) == x (byte-level BPE is lossless) and truncation with padding agrees
// with the untruncated ids.
func FuzzLlamaEncode(f *testing.F) {
	p := fixtureTokenizers(f)
	fx := parity.Load(f, "textenc")
	for _, c := range fx.Cases {
		if c.Op == "tokenize" {
			var prompt string
			c.InputValue(f, "prompt", &prompt)
			f.Add(prompt)
		}
	}
	for _, s := range []string{"", " ", "  \n\n\t x", "I'M it'ſ we're", "1234567 ١٢٣٤", "émojis 🎉 café 我爱北京",
		"<|eot_id|><|begin_of_text|>", "<|reserved_special_token_1", "a\x00b", "\xff\xfe", "e\u0301\u0301", "\r\n\r\n  "} {
		f.Add(s)
	}
	const maxLen = 32
	f.Fuzz(func(t *testing.T, s string) {
		enc, err := p.Llama.Encode(s, Options{NoSpecialTokens: true})
		if !utf8.ValidString(s) {
			if !errors.Is(err, ErrInvalidPrompt) {
				t.Fatalf("invalid UTF-8 %q: err = %v, want ErrInvalidPrompt", s, err)
			}
			if _, err := p.Encode(s, DefaultPromptConfig()); !errors.Is(err, ErrInvalidPrompt) {
				t.Fatalf("prompt %q: err = %v, want ErrInvalidPrompt", s, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("encode %q: %v", s, err)
		}
		back, err := p.Llama.Decode(enc.IDs, false)
		if err != nil || back != s {
			t.Fatalf("decode(encode(%q)) = %q, %v", s, back, err)
		}
		for _, tok := range []*Tokenizer{p.Llama, p.CLIP} {
			full, err := tok.Encode(s, Options{NoSpecialTokens: true})
			if err != nil {
				t.Fatal(err)
			}
			fixed, err := tok.Encode(s, Options{Truncate: true, Pad: true, MaxLength: maxLen})
			if err != nil {
				t.Fatal(err)
			}
			if len(fixed.IDs) != maxLen || len(fixed.Mask) != maxLen {
				t.Fatalf("%q: %d ids, %d mask, want %d", s, len(fixed.IDs), len(fixed.Mask), maxLen)
			}
			n := min(len(full.IDs), maxLen-tok.SpecialTokenCount())
			want := append(append(toInt64(tok.post.prefix), full.IDs[:n]...), toInt64(tok.post.suffix)...)
			pad, _ := tok.PadID()
			for i := range maxLen {
				wantID, wantMask := int64(pad), int64(0)
				if i < len(want) {
					wantID, wantMask = want[i], 1
				}
				if fixed.IDs[i] != wantID || fixed.Mask[i] != wantMask {
					t.Fatalf("%q position %d: id %d mask %d, want %d %d", s, i, fixed.IDs[i], fixed.Mask[i], wantID, wantMask)
				}
			}
		}
		if _, err := p.Encode(s, DefaultPromptConfig()); err != nil {
			t.Fatalf("prompt %q: %v", s, err)
		}
	})
}

// FuzzParseJSON: no tokenizer file makes the loader panic.
func FuzzParseJSON(f *testing.F) {
	f.Add(miniSpec{Pre: byteLevelPreJSON, Merges: []string{"a b"}, Extra: []string{"ab"}}.json(f))
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
		"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\s+(?!\\S)"}, "behavior": "MergedWithNext", "invert": true},
		"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Replace", "pattern": {"String": "a"}, "content": "b"}]},
		"post_processor": {"type": "RobertaProcessing", "sep": ["b", 1], "cls": ["a", 0]},
		"added_tokens": [{"id": 2, "content": "ab", "lstrip": true, "rstrip": true, "single_word": true, "normalized": true, "special": false}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := ParseJSON(data)
		if err != nil {
			return
		}
		for _, s := range []string{"", "ab ba  a\n", "é🎉"} {
			enc, err := tok.Encode(s, Options{})
			if err != nil {
				t.Fatalf("encode %q: %v", s, err)
			}
			_, _ = tok.Decode(enc.IDs, true)
		}
	})
}
