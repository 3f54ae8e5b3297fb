package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a piece of text before pre-tokenization (tokenizers' Normalizer; offsets are
// not tracked since nothing here needs them).
type normalizer interface {
	normalize(s string) string
}

type normalizerSeq []normalizer

func (q normalizerSeq) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

type unicodeNorm struct{ form norm.Form }

func (u unicodeNorm) normalize(s string) string { return u.form.String(s) }

// lowercase is Rust's char::to_lowercase applied rune by rune (tokenizers' Lowercase): Unicode's
// simple lower-case mapping, plus the one unconditional multi-rune mapping, U+0130 → "i̇".
type lowercase struct{}

func (lowercase) normalize(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return strings.ToLower(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == '\u0130' {
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// replaceLiteral replaces every occurrence of a fixed string.
type replaceLiteral struct{ pattern, content string }

func (r replaceLiteral) normalize(s string) string {
	if r.pattern == "" {
		return s
	}
	return strings.ReplaceAll(s, r.pattern, r.content)
}

// replaceWhitespace is Replace(Regex(`\s+`), content), written out (CLIP uses it).
type replaceWhitespace struct{ content string }

func (r replaceWhitespace) normalize(s string) string {
	var b strings.Builder
	changed, last := false, 0 // last: start of the text not yet copied
	for i := 0; i < len(s); {
		var n int
		if c := s[i]; c < utf8.RuneSelf {
			if asciiClass[c] != clsSpace {
				i++
				continue
			}
			n = 1
		} else {
			var sp bool
			if sp, n = spaceAt(s, i); !sp {
				i += n
				continue
			}
		}
		start := i
		for i += n; i < len(s); i += n {
			var sp bool
			if sp, n = spaceAt(s, i); !sp {
				break
			}
		}
		if i-start == 1 && s[start] == ' ' && r.content == " " {
			continue // a single space stays as it is
		}
		if !changed {
			b.Grow(len(s))
			changed = true
		}
		b.WriteString(s[last:start])
		b.WriteString(r.content)
		last = i
	}
	if !changed {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// spaceAt reports whether the rune at s[i:] is whitespace, and its width.
func spaceAt(s string, i int) (bool, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c] == clsSpace, 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return isSpace(r), n
}

// replaceRegex replaces every match of a regex with a literal.
type replaceRegex struct {
	re      *regexp2.Regexp
	content string
}

func (r replaceRegex) normalize(s string) string {
	out, err := r.re.ReplaceFunc(s, func(regexp2.Match) string { return r.content }, -1, -1)
	if err != nil {
		return s
	}
	return out
}

type strip struct{ left, right bool }

func (p strip) normalize(s string) string {
	if p.left {
		s = strings.TrimLeftFunc(s, isSpace)
	}
	if p.right {
		s = strings.TrimRightFunc(s, isSpace)
	}
	return s
}

type prepend struct{ prefix string }

func (p prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.prefix + s
}

type normalizerJSON struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	Pattern     *patternJSON      `json:"pattern"`
	Content     string            `json:"content"`
	StripLeft   bool              `json:"strip_left"`
	StripRight  bool              `json:"strip_right"`
	Prepend     string            `json:"prepend"`
}

// parseNormalizer reads a "normalizer" section; null gives nil.
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	n, err := parseNormalizerItem(raw)
	if err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	return n, nil
}

func parseNormalizerItem(raw json.RawMessage) (normalizer, error) {
	var j normalizerJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	switch j.Type {
	case "Sequence":
		var seq normalizerSeq
		for _, sub := range j.Normalizers {
			n, err := parseNormalizerItem(sub)
			if err != nil {
				return nil, err
			}
			seq = append(seq, n)
		}
		return seq, nil
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Strip":
		return strip{left: j.StripLeft, right: j.StripRight}, nil
	case "Prepend":
		return prepend{prefix: j.Prepend}, nil
	case "Replace":
		switch {
		case j.Pattern == nil:
			return nil, fmt.Errorf("replace: no pattern")
		case j.Pattern.String != nil:
			return replaceLiteral{pattern: *j.Pattern.String, content: j.Content}, nil
		case j.Pattern.Regex != nil:
			if *j.Pattern.Regex == `\s+` {
				return replaceWhitespace{content: j.Content}, nil
			}
			re, err := regexp2.Compile(*j.Pattern.Regex, regexp2.None)
			if err != nil {
				return nil, fmt.Errorf("%w: replace regex %q: %v", ErrUnsupported, *j.Pattern.Regex, err)
			}
			return replaceRegex{re: re, content: j.Content}, nil
		}
		return nil, fmt.Errorf("replace: pattern is neither String nor Regex")
	}
	return nil, unsupported("normalizer", j.Type)
}
