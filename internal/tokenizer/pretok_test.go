package tokenizer

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

func splitAll(f finder, s string) []string {
	out := []string{}
	f.matches(s, func(start, end int) bool {
		out = append(out, s[start:end])
		return true
	})
	return out
}

// Expectations below are derived by hand from the regex: alternatives are tried in order at each
// position, the first that matches wins, each quantifier is greedy.
func TestLlama3PreTokenizer(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty", "", []string{}},
		{"words", "Hello world", []string{"Hello", " world"}},
		// A run of spaces before a word gives all but one space; the last leads the word.
		{"multiple spaces and tabs", "  Multiple   spaces\tand tabs",
			[]string{" ", " Multiple", "  ", " spaces", "\tand", " tabs"}},
		{"two tabs", "a\t\tb", []string{"a", "\t", "\tb"}},
		{"trailing spaces", "hello  ", []string{"hello", "  "}},
		{"trailing space", "hello ", []string{"hello", " "}},
		{"space before digit stays alone", "numbers 1234567", []string{"numbers", " ", "123", "456", "7"}},
		{"digits 1-3", "1 12 123 1234", []string{"1", " ", "12", " ", "123", " ", "123", "4"}},
		{"digits inside words", "abc123def 3rd", []string{"abc", "123", "def", " ", "3", "rd"}},
		{"currency", "$100", []string{"$", "100"}},
		{"upper case", "UPPER case", []string{"UPPER", " case"}},
		{"contractions", "we're don't I'M it'S", []string{"we", "'re", " don", "'t", " I", "'M", " it", "'S"}},
		{"contraction two letters any case", "'Ll 'LL 'vE", []string{"'Ll", " '", "LL", " '", "vE"}},
		{"apostrophe then word", "'sun O'Neil", []string{"'s", "un", " O", "'Neil"}},
		{"long s folds to s", "it'ſ", []string{"it", "'ſ"}},
		{"newlines", "a\n\nb", []string{"a", "\n\n", "b"}},
		{"space newline space", "a \n b", []string{"a", " \n", " b"}},
		{"newlines then trailing spaces", "a  \n\n  ", []string{"a", "  \n\n", "  "}},
		{"crlf", "x\r\ny", []string{"x", "\r\n", "y"}},
		{"punctuation keeps newlines", "Hi!\n\nThere", []string{"Hi", "!\n\n", "There"}},
		{"punctuation", "Hello, world!!! a ,b", []string{"Hello", ",", " world", "!!!", " a", " ,", "b"}},
		{"accents", "café émojis", []string{"café", " émojis"}},
		{"emoji after space", "émojis 🎉 café", []string{"émojis", " 🎉", " café"}},
		{"combining mark", "cafe\u0301 e\u0301té", []string{"cafe", "\u0301", " e", "\u0301té"}},
		{"cjk", "我爱北京", []string{"我爱北京"}},
		{"cjk punctuation", "你好，世界", []string{"你好", "，世界"}},
		{"kana", "日本語のテキスト", []string{"日本語のテキスト"}},
		{"nbsp is whitespace", "a\u00a0b", []string{"a", "\u00a0b"}},
		{"ideographic space run", "a\u3000\u3000b", []string{"a", "\u3000", "\u3000b"}},
		{"other numbers", "١٢٣٤ ½Ⅻ", []string{"١٢٣", "٤", " ", "½Ⅻ"}},
		{"special-looking text", "<|eot_id|>", []string{"<|", "eot", "_id", "|>"}},
		{"nul", "a\x00b\x00 \x00", []string{"a", "\x00b", "\x00", " \x00"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := splitAll(llama3Finder{}, tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("split(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestGPT2PreTokenizer(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"words", "Hello world", []string{"Hello", " world"}},
		{"case-sensitive contractions", "I'M it's", []string{"I", "'", "M", " it", "'s"}},
		{"spaces", "a  b", []string{"a", " ", " b"}},
		{"numbers unbounded", "x 1234567", []string{"x", " 1234567"}},
		{"newlines split", "a\n\nb", []string{"a", "\n", "\n", "b"}},
		{"punctuation", "ok?! ...", []string{"ok", "?!", " ..."}},
		{"trailing", "end   ", []string{"end", "   "}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := splitAll(gpt2Finder{}, tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("split(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestCLIPPreTokenizer(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"words", "a photo of 2 cats!!", []string{"a", "photo", "of", "2", "cats", "!!"}},
		{"digits one by one", "1234567", []string{"1", "2", "3", "4", "5", "6", "7"}},
		{"contractions", "it's don't!", []string{"it", "'s", "don", "'t", "!"}},
		{"special text", "<|endoftext|>hello <|startoftext|>", []string{"<|endoftext|>", "hello", "<|startoftext|>"}},
		{"special inside punctuation run", "!<|endoftext|>", []string{"!<|", "endoftext", "|>"}},
		{"whitespace dropped", "  a\t\nb  ", []string{"a", "b"}},
		{"emoji and accents", "émojis 🎉 café", []string{"émojis", "🎉", "café"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := splitAll(clipFinder{}, tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("split(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestSplitBehaviors(t *testing.T) {
	// tokenizers' own examples (normalizer.rs): splitting "The-final--countdown" on "-".
	tests := []struct {
		b    behavior
		want []string
	}{
		{behaviorRemoved, []string{"The", "final", "countdown"}},
		{behaviorIsolated, []string{"The", "-", "final", "-", "-", "countdown"}},
		{behaviorMergedWithPrevious, []string{"The-", "final-", "-", "countdown"}},
		{behaviorMergedWithNext, []string{"The", "-final", "-", "-countdown"}},
		{behaviorContiguous, []string{"The", "-", "final", "--", "countdown"}},
	}
	for _, tc := range tests {
		p := &splitPre{f: literalFinder{lit: "-"}, behavior: tc.b}
		var got []string
		p.split("The-final--countdown", func(s string) bool { got = append(got, s); return true })
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("behavior %d: got %q, want %q", tc.b, got, tc.want)
		}
	}
	// Invert + Removed keeps the matches only (CLIP).
	p := &splitPre{f: literalFinder{lit: "ab"}, behavior: behaviorRemoved, invert: true}
	var got []string
	p.split("xxabyyabab", func(s string) bool { got = append(got, s); return true })
	if want := []string{"ab", "ab", "ab"}; !reflect.DeepEqual(got, want) {
		t.Errorf("invert removed: got %q, want %q", got, want)
	}
}

// TestPreTokenizersMatchRegexEngine compares the hand-written scanners with regexp2 running the
// patterns themselves, on random strings over an alphabet of the characters that matter (letters
// of several scripts and cases, numbers, every kind of whitespace, apostrophes, punctuation,
// symbols, marks, NUL). U+017F is left out: Oniguruma folds it to s, .NET does not (covered by a
// hand-derived case above).
func TestPreTokenizersMatchRegexEngine(t *testing.T) {
	alphabet := []string{"a", "b", "Z", "s", "S", "t", "T", "r", "e", "E", "v", "m", "M", "d", "l", "L",
		"é", "我", "Ω", "ǅ", " ", " ", " ", "\t", "\n", "\r", "\v", "\f", "\u0085", "\u00a0", "\u1680", "\u2003",
		"\u2028", "\u3000", "1", "9", "٣", "½", "Ⅻ", "'", "'", "!", ",", ".", "$", "_", "<", "|", ">", "🎉",
		"\u0301", "\u200b", "\x00", "\x7f"}
	rng := rand.New(rand.NewPCG(1, 2))
	patterns := []struct {
		name    string
		pattern string
		f       finder
	}{{"llama3", PatternLlama3, llama3Finder{}}, {"gpt2", PatternGPT2, gpt2Finder{}}, {"clip", PatternCLIP, clipFinder{}}}
	for _, p := range patterns {
		re := &regexFinder{re: regexp2.MustCompile(p.pattern, regexp2.None)}
		for i := range 3000 {
			var b strings.Builder
			for range rng.IntN(24) {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			s := b.String()
			got, want := splitAll(p.f, s), splitAll(re, s)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s, string %d %q:\n scanner %q\n  regex  %q", p.name, i, s, got, want)
			}
		}
	}
}
