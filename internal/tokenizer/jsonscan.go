package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// jscan is a small JSON reader for the large parts of tokenizer files (a Llama 3 tokenizer.json
// has 128k vocabulary entries and 280k merges): strings without escapes are returned as
// substrings of the document, so reading them allocates nothing. Small sections are handed to
// encoding/json as raw values.
type jscan struct {
	src   string
	pos   int
	depth int
}

const maxJSONDepth = 1000

func (s *jscan) errorf(format string, args ...any) error {
	return fmt.Errorf("json at byte %d: %s", s.pos, fmt.Sprintf(format, args...))
}

func (s *jscan) ws() {
	for s.pos < len(s.src) {
		switch s.src[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte (0 at the end).
func (s *jscan) peek() byte {
	s.ws()
	if s.pos >= len(s.src) {
		return 0
	}
	return s.src[s.pos]
}

func (s *jscan) consume(c byte) error {
	if s.peek() != c {
		if s.pos >= len(s.src) {
			return s.errorf("want %q, got end of input", c)
		}
		return s.errorf("want %q, got %q", c, s.src[s.pos])
	}
	s.pos++
	return nil
}

// strEnd returns the index of the closing quote of the string whose opening quote is at s.pos,
// and whether it has escapes.
func (s *jscan) strEnd() (int, bool, error) {
	if s.peek() != '"' {
		return 0, false, s.errorf("want a string")
	}
	esc := false
	for i := s.pos + 1; i < len(s.src); i++ {
		switch c := s.src[i]; {
		case c == '"':
			return i, esc, nil
		case c == '\\':
			esc = true
			i++
		case c < 0x20:
			return 0, false, s.errorf("control character in string")
		}
	}
	return 0, false, s.errorf("unterminated string")
}

// str reads a string.
func (s *jscan) str() (string, error) {
	end, esc, err := s.strEnd()
	if err != nil {
		return "", err
	}
	start := s.pos
	s.pos = end + 1
	if v := s.src[start+1 : end]; !esc && utf8.ValidString(v) {
		return v, nil
	}
	var v string
	if err := json.Unmarshal([]byte(s.src[start:end+1]), &v); err != nil {
		return "", fmt.Errorf("json at byte %d: %w", start, err)
	}
	return v, nil
}

// uint reads a non-negative integer below 2^31.
func (s *jscan) uint() (int32, error) {
	s.ws()
	start := s.pos
	var v int64
	for s.pos < len(s.src) && s.src[s.pos] >= '0' && s.src[s.pos] <= '9' {
		v = v*10 + int64(s.src[s.pos]-'0')
		if v >= 1<<31 {
			return 0, s.errorf("integer out of range")
		}
		s.pos++
	}
	if s.pos == start {
		return 0, s.errorf("want a non-negative integer")
	}
	if s.pos < len(s.src) && strings.IndexByte(".eE", s.src[s.pos]) >= 0 {
		return 0, s.errorf("want an integer")
	}
	return int32(v), nil
}

// skip moves past one value.
func (s *jscan) skip() error {
	switch c := s.peek(); c {
	case '"':
		end, _, err := s.strEnd()
		if err != nil {
			return err
		}
		s.pos = end + 1
		return nil
	case '{':
		return s.object(func(string) error { return s.skip() })
	case '[':
		return s.array(s.skip)
	case 0:
		return s.errorf("want a value, got end of input")
	default:
		start := s.pos
		for s.pos < len(s.src) && strings.IndexByte("+-.0123456789eEtruefalsn", s.src[s.pos]) >= 0 {
			s.pos++
		}
		if s.pos == start {
			return s.errorf("unexpected %q", c)
		}
		return nil
	}
}

// raw returns the text of the next value.
func (s *jscan) raw() (string, error) {
	s.ws()
	start := s.pos
	if err := s.skip(); err != nil {
		return "", err
	}
	return s.src[start:s.pos], nil
}

// object calls fn for each member; fn must read the member's value.
func (s *jscan) object(fn func(key string) error) error {
	if err := s.consume('{'); err != nil {
		return err
	}
	if s.depth++; s.depth > maxJSONDepth {
		return s.errorf("nested too deeply")
	}
	defer func() { s.depth-- }()
	if s.peek() == '}' {
		s.pos++
		return nil
	}
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if err := s.consume(':'); err != nil {
			return err
		}
		if err := fn(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return nil
		case 0:
			return s.errorf("want ',' or '}', got end of input")
		default:
			return s.errorf("want ',' or '}'")
		}
	}
}

// array calls fn for each element; fn must read the element.
func (s *jscan) array(fn func() error) error {
	if err := s.consume('['); err != nil {
		return err
	}
	if s.depth++; s.depth > maxJSONDepth {
		return s.errorf("nested too deeply")
	}
	defer func() { s.depth-- }()
	if s.peek() == ']' {
		s.pos++
		return nil
	}
	for {
		if err := fn(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return nil
		case 0:
			return s.errorf("want ',' or ']', got end of input")
		default:
			return s.errorf("want ',' or ']'")
		}
	}
}

// vocab reads a {"token": id, ...} object.
func (s *jscan) vocab() (map[string]int32, error) {
	s.ws()
	start := s.pos
	if err := s.skip(); err != nil {
		return nil, err
	}
	size := strings.Count(s.src[start:s.pos], ":")
	s.pos = start
	m := make(map[string]int32, size)
	err := s.object(func(key string) error {
		id, err := s.uint()
		if err != nil {
			return err
		}
		m[key] = id
		return nil
	})
	return m, err
}

// merges reads a merges list: "a b" strings (legacy) or ["a", "b"] pairs.
func (s *jscan) merges() ([][2]string, error) {
	// Size the list first: every merge has at least two quotes.
	s.ws()
	start := s.pos
	if err := s.skip(); err != nil {
		return nil, err
	}
	out := make([][2]string, 0, strings.Count(s.src[start:s.pos], `"`)/2)
	s.pos = start
	err := s.array(func() error {
		switch s.peek() {
		case '"':
			v, err := s.str()
			if err != nil {
				return err
			}
			a, b, ok := strings.Cut(v, " ")
			if !ok || strings.Contains(b, " ") {
				return fmt.Errorf("merge %d: %q is not two tokens separated by one space", len(out), v)
			}
			out = append(out, [2]string{a, b})
		case '[':
			var pair [2]string
			n := 0
			if err := s.array(func() error {
				v, err := s.str()
				if err != nil {
					return err
				}
				if n < 2 {
					pair[n] = v
				}
				n++
				return nil
			}); err != nil {
				return err
			}
			if n != 2 {
				return fmt.Errorf("merge %d: %d tokens, want 2", len(out), n)
			}
			out = append(out, pair)
		default:
			return s.errorf("want a merge")
		}
		return nil
	})
	return out, err
}
