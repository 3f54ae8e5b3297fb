package tokenizer

import "unicode/utf8"

// GPT-2's byte-level alphabet: every byte maps to one printable rune, so any byte string is a
// string of vocabulary characters. Printable Latin-1 bytes map to themselves, the others to
// U+0100 + n in byte order.
var (
	byteRune   [256]rune   // byte → rune
	byteString [256]string // byte → the rune's UTF-8
	runeByte   [512]int16  // rune → byte, -1 where the rune is not in the alphabet
)

func init() {
	for i := range runeByte {
		runeByte[i] = -1
	}
	n := 0
	for b := 0; b < 256; b++ {
		keep := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if keep {
			byteRune[b] = rune(b)
		} else {
			byteRune[b] = rune(256 + n)
			n++
		}
		byteString[b] = string(byteRune[b])
		runeByte[byteRune[b]] = int16(b)
	}
}

// appendByteLevel appends the byte-level spelling of s to dst.
func appendByteLevel(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		dst = append(dst, byteString[s[i]]...)
	}
	return dst
}

// appendFromByteLevel appends the bytes that token spells in the byte-level alphabet to dst; a
// token with a rune outside the alphabet is appended as it is (as tokenizers' ByteLevel decoder
// does).
func appendFromByteLevel(dst []byte, token string) []byte {
	start := len(dst)
	for _, r := range token {
		if r < 0 || int(r) >= len(runeByte) || runeByte[r] < 0 {
			return append(dst[:start], token...)
		}
		dst = append(dst, byte(runeByte[r]))
	}
	return dst
}

// Character classes of the split patterns: \p{L}, \p{N}, \s (Unicode White_Space, as Oniguruma's
// \s), and everything else.
const (
	clsOther uint8 = iota
	clsLetter
	clsNumber
	clsSpace
)

var asciiClass [utf8.RuneSelf]uint8

func init() {
	for r := rune(0); r < utf8.RuneSelf; r++ {
		asciiClass[r] = classSlow(r)
	}
}

func classSlow(r rune) uint8 {
	switch {
	case isLetter(r):
		return clsLetter
	case isNumber(r):
		return clsNumber
	case isSpace(r):
		return clsSpace
	}
	return clsOther
}

func classOf(r rune) uint8 {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	return classSlow(r)
}

// decodeAt returns the rune at s[i:] and its width (s is valid UTF-8).
func decodeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// scanClass returns the end of the run of runes of class c starting at i.
func scanClass(s string, i int, c uint8) int {
	for i < len(s) {
		r, n := decodeAt(s, i)
		if classOf(r) != c {
			break
		}
		i += n
	}
	return i
}
