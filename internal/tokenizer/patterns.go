package tokenizer

import (
	"strings"
	"unicode"

	"github.com/dlclark/regexp2"
)

// The split patterns that have hand-written scanners. They are compared with a tokenizer file's
// pattern byte for byte.
const (
	// PatternLlama3 is the Llama 3 (tiktoken cl100k-style) pre-tokenizer regex.
	PatternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// PatternGPT2 is the GPT-2 regex that tokenizers' ByteLevel pre-tokenizer uses (use_regex).
	PatternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// PatternCLIP is the regex of CLIP's tokenizer (matches are the words; gaps are removed).
	PatternCLIP = `<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+`
)

func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }

// isSpace is Unicode White_Space, which is what \s means to Oniguruma and Rust's regex, and what
// Rust's char::is_whitespace tests. Go's unicode.IsSpace is the same set.
func isSpace(r rune) bool { return unicode.IsSpace(r) }

// finder lists pattern matches: leftmost first, not overlapping, as a regex engine's find-all.
type finder interface {
	// matches calls fn with each match's byte span in order until fn returns false; it returns
	// false when fn did.
	matches(s string, fn func(start, end int) bool) bool
}

// finderFor returns the scanner for a regex pattern: a hand-written one for the known patterns,
// regexp2 otherwise.
func finderFor(pattern string) (finder, error) {
	switch pattern {
	case PatternLlama3:
		return llama3Finder{}, nil
	case PatternGPT2:
		return gpt2Finder{}, nil
	case PatternCLIP:
		return clipFinder{}, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, err
	}
	return &regexFinder{re: re}, nil
}

// contractionEnd matches the tail of 's|'t|'re|'ve|'m|'ll|'d at i (just after the apostrophe) and
// returns the match end, or -1. With fold set it matches case-insensitively as Oniguruma does:
// Unicode simple case folding, under which U+017F (long s) is an s.
func contractionEnd(s string, i int, fold bool) int {
	if i >= len(s) {
		return -1
	}
	c := s[i]
	if fold {
		if c == 0xC5 && i+1 < len(s) && s[i+1] == 0xBF { // U+017F ſ folds to s
			return i + 2
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
	}
	switch c {
	case 's', 't', 'm', 'd':
		return i + 1
	case 'r', 'v', 'l':
		if i+1 >= len(s) {
			return -1
		}
		c2 := s[i+1]
		if fold && c2 >= 'A' && c2 <= 'Z' {
			c2 += 'a' - 'A'
		}
		want := byte('e')
		if c == 'l' {
			want = 'l'
		}
		if c2 == want {
			return i + 2
		}
	}
	return -1
}

// scanNewlines returns the end of the run of \r and \n starting at i.
func scanNewlines(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// whitespaceTail resolves the whitespace alternatives `\s+(?!\S)|\s+` for a run of whitespace
// starting at i: the whole run when it reaches the end of s or is one rune long, otherwise the run
// less its last rune (which then leads the next word).
func whitespaceTail(s string, i int) int {
	end, last := i, i
	for end < len(s) {
		r, n := decodeAt(s, end)
		if classOf(r) != clsSpace {
			break
		}
		last = end
		end += n
	}
	if end == len(s) || last == i {
		return end
	}
	return last
}

// llama3Finder scans PatternLlama3. Every position starts a match (the alternatives cover
// letters, numbers, whitespace and everything else), so a match always starts at from.
type llama3Finder struct{}

func (llama3Finder) matches(s string, fn func(start, end int) bool) bool {
	for i := 0; i < len(s); {
		e := llama3End(s, i)
		if !fn(i, e) {
			return false
		}
		i = e
	}
	return true
}

// llama3End returns the end of the PatternLlama3 match at i, trying the alternatives in order as a
// backtracking engine does (the first alternative that matches wins, each greedy).
func llama3End(s string, i int) int {
	r, n := decodeAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' {
		if e := contractionEnd(s, i+1, true); e > 0 {
			return e
		}
	}
	c := classOf(r)
	switch c {
	case clsLetter: // [^\r\n\p{L}\p{N}]? takes nothing, \p{L}+
		return scanClass(s, i+n, clsLetter)
	case clsNumber: // \p{N}{1,3}
		j := i + n
		for k := 0; k < 2 && j < len(s); k++ {
			r2, n2 := decodeAt(s, j)
			if classOf(r2) != clsNumber {
				break
			}
			j += n2
		}
		return j
	}
	// [^\r\n\p{L}\p{N}]\p{L}+ : one non-letter, non-number (not CR/LF) rune before letters.
	if r != '\r' && r != '\n' && i+n < len(s) {
		r2, n2 := decodeAt(s, i+n)
		if classOf(r2) == clsLetter {
			return scanClass(s, i+n+n2, clsLetter)
		}
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	if c == clsOther {
		return scanNewlines(s, scanClass(s, i+n, clsOther))
	}
	if r == ' ' && i+1 < len(s) {
		r2, n2 := decodeAt(s, i+1)
		if classOf(r2) == clsOther {
			return scanNewlines(s, scanClass(s, i+1+n2, clsOther))
		}
	}
	// r is whitespace. `\s*[\r\n]+`: up to the last CR/LF of the whitespace run, if it has one.
	lastNL := -1
	for j := i; j < len(s); {
		r2, n2 := decodeAt(s, j)
		if classOf(r2) != clsSpace {
			break
		}
		j += n2
		if r2 == '\r' || r2 == '\n' {
			lastNL = j
		}
	}
	if lastNL > 0 {
		return lastNL
	}
	// `\s+(?!\S)|\s+`
	return whitespaceTail(s, i)
}

// gpt2Finder scans PatternGPT2; like Llama 3's, every position starts a match.
type gpt2Finder struct{}

func (gpt2Finder) matches(s string, fn func(start, end int) bool) bool {
	for i := 0; i < len(s); {
		e := gpt2End(s, i)
		if !fn(i, e) {
			return false
		}
		i = e
	}
	return true
}

func gpt2End(s string, i int) int {
	r, n := decodeAt(s, i)
	if r == '\'' {
		if e := contractionEnd(s, i+1, false); e > 0 {
			return e
		}
	}
	c, j := classOf(r), i+n
	if r == ' ' && j < len(s) { // ` ?` before letters, numbers or other
		r2, n2 := decodeAt(s, j)
		if c2 := classOf(r2); c2 != clsSpace {
			c, j = c2, j+n2
		}
	}
	if c != clsSpace {
		return scanClass(s, j, c)
	}
	return whitespaceTail(s, i)
}

// clipFinder scans PatternCLIP. Whitespace starts no match; the pattern is case-sensitive (CLIP
// lower-cases before splitting).
type clipFinder struct{}

const (
	clipStartToken = "<|startoftext|>"
	clipEndToken   = "<|endoftext|>"
)

func (clipFinder) matches(s string, fn func(start, end int) bool) bool {
	for i := 0; i < len(s); {
		start, end, ok := clipNext(s, i)
		if !ok {
			break
		}
		if !fn(start, end) {
			return false
		}
		i = end
	}
	return true
}

// clipNext returns the first PatternCLIP match at or after i.
func clipNext(s string, i int) (int, int, bool) {
	for i < len(s) {
		r, n := decodeAt(s, i)
		c := classOf(r)
		if c == clsSpace {
			i += n
			continue
		}
		switch {
		case strings.HasPrefix(s[i:], clipStartToken):
			return i, i + len(clipStartToken), true
		case strings.HasPrefix(s[i:], clipEndToken):
			return i, i + len(clipEndToken), true
		case r == '\'':
			if e := contractionEnd(s, i+1, false); e > 0 {
				return i, e, true
			}
		}
		switch c {
		case clsLetter:
			return i, scanClass(s, i+n, clsLetter), true
		case clsNumber:
			return i, i + n, true
		}
		return i, scanClass(s, i+n, clsOther), true
	}
	return 0, 0, false
}

// literalFinder finds a fixed string (a Split pattern given as {"String": ...}).
type literalFinder struct{ lit string }

func (f literalFinder) matches(s string, fn func(start, end int) bool) bool {
	if f.lit == "" {
		return true
	}
	for i := 0; i <= len(s); {
		k := strings.Index(s[i:], f.lit)
		if k < 0 {
			break
		}
		if !fn(i+k, i+k+len(f.lit)) {
			return false
		}
		i += k + len(f.lit)
	}
	return true
}

// regexFinder runs any other pattern on regexp2 (.NET syntax and semantics, which agree with
// Oniguruma's for the constructs tokenizer files use).
type regexFinder struct {
	re *regexp2.Regexp
}

func (f *regexFinder) matches(s string, fn func(start, end int) bool) bool {
	// regexp2 reports rune indices; matches come in order, so one cursor converts them.
	runePos, bytePos := 0, 0
	toByte := func(k int) int {
		for runePos < k && bytePos < len(s) {
			_, n := decodeAt(s, bytePos)
			bytePos += n
			runePos++
		}
		return bytePos
	}
	m, err := f.re.FindStringMatch(s)
	for err == nil && m != nil {
		start := toByte(m.Index)
		end := toByte(m.Index + m.Length)
		if !fn(start, end) {
			return false
		}
		m, err = f.re.FindNextMatch(m)
	}
	return true
}
