package tokenizer

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
)

// benchWords builds an n-word English-like prompt (fixed seed): words of varied length, some
// capitalised, punctuation, digits.
func benchWords(n int) string {
	words := strings.Fields(`the a girl dances gracefully with clear movements full of charm cat sits on red chair
		sunlight moves slowly across room camera pans over mountain river forest while birds fly high
		cinematic lighting dramatic shadows vivid colors shallow depth field portrait smiling woman walks
		along beach waves roll sparkles sunset snowy detailed texture background environment atmosphere
		extraordinarily photorealistic unbelievable characterization transitions temporal relationships`)
	rng := rand.New(rand.NewPCG(7, 8))
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		w := words[rng.IntN(len(words))]
		if rng.IntN(10) == 0 {
			w = strings.ToUpper(w[:1]) + w[1:]
		}
		b.WriteString(w)
		switch rng.IntN(20) {
		case 0:
			b.WriteString(",")
		case 1:
			b.WriteString(".")
		case 2:
			b.WriteString(" 1080")
		}
	}
	return b.String()
}

// randomWords builds n words of 3 to 12 random letters: no word is in the vocabulary or repeats,
// so each one is merged from its bytes.
func randomWords(n int) string {
	rng := rand.New(rand.NewPCG(9, 10))
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		for range 3 + rng.IntN(10) {
			b.WriteByte(byte('a' + rng.IntN(26)))
		}
	}
	return b.String()
}

// BenchmarkLlamaTokenize2000Words tokenises a 2,000-word prompt completely (no truncation): warm
// (the per-word cache filled, a worker's steady state), cold (cache emptied first), and random
// (2,000 distinct non-words, cache emptied: every word goes through the merge loop).
func BenchmarkLlamaTokenize2000Words(b *testing.B) {
	tok := fixtureTokenizers(b).Llama
	for _, tc := range []struct {
		name string
		text string
		cold bool
	}{{"warm", benchWords(2000), false}, {"cold", benchWords(2000), true}, {"random", randomWords(2000), true}} {
		text, cold := tc.text, tc.cold
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			var n int
			for b.Loop() {
				if cold {
					tok.model.cache.reset()
				}
				enc, err := tok.Encode(text, Options{})
				if err != nil {
					b.Fatal(err)
				}
				n = len(enc.IDs)
			}
			b.ReportMetric(float64(n), "ids")
		})
	}
}

// BenchmarkCLIPTokenize tokenises a 2,000-word prompt with the CLIP tokenizer, completely and as
// the worker does (truncated to 77).
func BenchmarkCLIPTokenize(b *testing.B) {
	tok := fixtureTokenizers(b).CLIP
	text := benchWords(2000)
	for _, tc := range []struct {
		name string
		opt  Options
	}{{"full", Options{}}, {"max77", Options{Truncate: true, Pad: true, MaxLength: 77}}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			var n int
			for b.Loop() {
				tok.model.cache.reset()
				enc, err := tok.Encode(text, tc.opt)
				if err != nil {
					b.Fatal(err)
				}
				n = len(enc.IDs)
			}
			b.ReportMetric(float64(n), "ids")
		})
	}
}

// BenchmarkPromptEncode is the worker's call: template, both tokenizers, truncation and padding.
func BenchmarkPromptEncode(b *testing.B) {
	p := fixtureTokenizers(b)
	for _, n := range []int{20, 2000} {
		text := benchWords(n)
		b.Run(strings.Repeat("w", 0)+itoa(n)+"words", func(b *testing.B) {
			for b.Loop() {
				if _, err := p.Encode(text, DefaultPromptConfig()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHugePrompt encodes 1 MB prompts the worker's way (truncated): ordinary text, and one
// 1 MB word that BPE must merge whole.
func BenchmarkHugePrompt(b *testing.B) {
	p := fixtureTokenizers(b)
	unit := "A cat sits on a red chair; the sunlight moves slowly across the room. 1234567 émojis 🎉\n"
	for _, tc := range []struct{ name, text string }{
		{"text", strings.Repeat(unit, (1<<20)/len(unit)+1)},
		{"oneword", strings.Repeat("!", 1<<20)},
		{"letters", strings.Repeat("ab", 1<<19)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.text)))
			for b.Loop() {
				if _, err := p.Encode(tc.text, DefaultPromptConfig()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoadLlama loads Meta's Llama 3 tokenizer.json (128k tokens, 280k merges) from the
// fixture set.
func BenchmarkLoadLlama(b *testing.B) {
	fx := parity.Load(b, "textenc")
	dir, err := fx.ModelPath("tokenizer")
	if err != nil {
		b.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
		b.SetBytes(fi.Size())
	}
	for b.Loop() {
		if _, err := LoadDir(dir); err != nil {
			b.Fatal(err)
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}
