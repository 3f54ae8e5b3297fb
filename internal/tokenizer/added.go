package tokenizer

import (
	"strings"
	"unicode"
)

// addedToken is an entry of tokenizer.json's added_tokens (or a special token named by
// tokenizer_config.json).
type addedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// tokenTrie finds added tokens in text, leftmost-longest (as tokenizers' Aho-Corasick with
// MatchKind::LeftmostLongest).
type tokenTrie struct {
	next  map[uint64]int32 // node<<8 | byte → child node
	token []int32          // node → index into tokens, -1 if no token ends there
	first [256]bool        // bytes that start a token
	empty bool
}

// newTokenTrie indexes patterns[i] as token i; empty patterns are left out.
func newTokenTrie(patterns []string) *tokenTrie {
	t := &tokenTrie{next: make(map[uint64]int32), token: []int32{-1}, empty: true}
	for i, p := range patterns {
		if p == "" {
			continue
		}
		t.empty = false
		t.first[p[0]] = true
		node := int32(0)
		for j := 0; j < len(p); j++ {
			k := uint64(node)<<8 | uint64(p[j])
			child, ok := t.next[k]
			if !ok {
				child = int32(len(t.token))
				t.token = append(t.token, -1)
				t.next[k] = child
			}
			node = child
		}
		// A content listed twice keeps the last entry, as a map from content would.
		t.token[node] = int32(i)
	}
	return t
}

// find returns the leftmost-longest token match at or after from.
func (t *tokenTrie) find(s string, from int) (start, end int, tok int32, ok bool) {
	if t.empty {
		return 0, 0, 0, false
	}
	for i := from; i < len(s); i++ {
		if !t.first[s[i]] {
			continue
		}
		node, best, bestEnd := int32(0), int32(-1), 0
		for j := i; j < len(s); j++ {
			child, ok := t.next[uint64(node)<<8|uint64(s[j])]
			if !ok {
				break
			}
			node = child
			if t.token[node] >= 0 {
				best, bestEnd = t.token[node], j+1
			}
		}
		if best >= 0 {
			return i, bestEnd, best, true
		}
	}
	return 0, 0, 0, false
}

// isWordRune is Rust regex's \w: alphabetic, marks, decimal digits, connector punctuation.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r) ||
		unicode.Is(unicode.Other_Alphabetic, r) || unicode.Is(unicode.Nl, r) || r == '\u200c' || r == '\u200d'
}

// splitAdded cuts s around the added tokens found by trie (tokenizers'
// AddedVocabulary::find_matches): text spans go to text, token matches to token. Either callback
// returning false stops the walk, and splitAdded returns false.
func splitAdded(s string, t *tokenTrie, tokens []addedToken, text func(string) bool, token func(int32) bool) bool {
	if t == nil || t.empty {
		return s == "" || text(s)
	}
	startOffset := 0
	for pos := 0; pos < len(s); {
		st, en, idx, ok := t.find(s, pos)
		if !ok {
			break
		}
		pos = en
		tok := tokens[idx]
		if tok.SingleWord {
			startSpace := st == 0 || !endsWithWord(s[:st])
			stopSpace := en == len(s) || !startsWithWord(s[en:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.LStrip {
			st = max(len(strings.TrimRightFunc(s[:st], isSpace)), startOffset)
		}
		if tok.RStrip {
			en = len(s) - len(strings.TrimLeftFunc(s[en:], isSpace))
		}
		if startOffset < st && !text(s[startOffset:st]) {
			return false
		}
		if !token(tok.ID) {
			return false
		}
		startOffset = en
	}
	if startOffset < len(s) {
		return text(s[startOffset:])
	}
	return true
}

func endsWithWord(s string) bool {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] < 0x80 || s[i] >= 0xC0 { // start of the last rune
			r, _ := decodeAt(s, i)
			return isWordRune(r)
		}
	}
	return false
}

func startsWithWord(s string) bool {
	if s == "" {
		return false
	}
	r, _ := decodeAt(s, 0)
	return isWordRune(r)
}
