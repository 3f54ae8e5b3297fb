package tokenizer

import (
	"fmt"
	"strings"
)

// Tokenizer encodes text to token ids and back. Build one with LoadDir or ParseJSON; it is
// immutable afterwards (apart from an internal word cache) and safe for concurrent use.
type Tokenizer struct {
	model *bpeModel
	norm  normalizer
	pre   parsedPre
	post  postProcess

	added      []addedToken
	addedIndex map[string]int // content → index in added
	addedByID  map[int32]int  // id → index in added
	rawTrie    *tokenTrie     // tokens matched before normalization (normalized=false)
	normTrie   *tokenTrie     // tokens matched in normalized text (normalized=true)

	decoder    []decodeStep
	decoderErr error

	padID          int32
	padToken       string
	hasPad         bool
	padLeft        bool
	truncLeft      bool
	modelMaxLength int // tokenizer_config.json's model_max_length; 0 if none
	fileMaxLength  int // tokenizer.json's truncation max_length; 0 if none
	filePadLength  int // tokenizer.json's fixed padding length; 0 if none
}

// Options shape one Encode call, as the arguments of a transformers tokenizer call do.
type Options struct {
	// NoSpecialTokens leaves out what the post-processor adds, such as BOS
	// (add_special_tokens=False).
	NoSpecialTokens bool
	// Truncate keeps at most MaxLength ids, special tokens included (truncation=True); the
	// sequence is cut on the tokenizer's truncation side (right unless configured otherwise).
	Truncate bool
	// Pad appends the pad token (with mask 0) up to MaxLength (padding="max_length"), on the
	// tokenizer's padding side.
	Pad bool
	// MaxLength is max_length. Zero means the tokenizer's own: model_max_length from
	// tokenizer_config.json, else tokenizer.json's truncation or padding length.
	MaxLength int
}

// Encoding is the result of Encode, in the reference's dtype (int64).
type Encoding struct {
	// IDs are the token ids.
	IDs []int64
	// Mask is the attention mask: 1 for tokens, 0 for padding.
	Mask []int64
}

// Encode tokenises text. It fails with an error wrapping ErrInvalidPrompt when text is not valid
// UTF-8.
func (t *Tokenizer) Encode(text string, opt Options) (Encoding, error) {
	if err := checkUTF8(text); err != nil {
		return Encoding{}, err
	}
	var pre, suf []int32
	if !opt.NoSpecialTokens {
		pre, suf = t.post.prefix, t.post.suffix
	}
	maxLen := opt.MaxLength
	if maxLen < 0 {
		return Encoding{}, fmt.Errorf("encode: max length %d is negative", maxLen)
	}
	if maxLen == 0 && (opt.Truncate || opt.Pad) {
		switch {
		case t.modelMaxLength > 0:
			maxLen = t.modelMaxLength
		case opt.Truncate && t.fileMaxLength > 0:
			maxLen = t.fileMaxLength
		case t.filePadLength > 0:
			maxLen = t.filePadLength
		default:
			return Encoding{}, fmt.Errorf("encode: truncation or padding asked without a max length, and the tokenizer has none")
		}
	}
	if opt.Pad && !t.hasPad {
		return Encoding{}, fmt.Errorf("encode: %w", ErrNoPadToken)
	}
	limit, stopAt := -1, -1
	if opt.Truncate {
		limit = maxLen - len(pre) - len(suf)
		if limit < 0 {
			return Encoding{}, fmt.Errorf("encode: max length %d leaves no room for %d special tokens", maxLen, len(pre)+len(suf))
		}
		if !t.truncLeft {
			stopAt = limit
		}
	}
	ids := t.encodeSequence(text, stopAt)
	if limit >= 0 && len(ids) > limit {
		if t.truncLeft {
			ids = ids[len(ids)-limit:]
		} else {
			ids = ids[:limit]
		}
	}
	n := len(pre) + len(ids) + len(suf)
	total := n
	if opt.Pad && maxLen > n {
		total = maxLen
	}
	enc := Encoding{IDs: make([]int64, 0, total), Mask: make([]int64, total)}
	padding := total - n
	if t.padLeft {
		enc.IDs = appendRepeat(enc.IDs, int64(t.padID), padding)
	}
	for _, part := range [][]int32{pre, ids, suf} {
		for _, id := range part {
			enc.IDs = append(enc.IDs, int64(id))
		}
	}
	if !t.padLeft {
		enc.IDs = appendRepeat(enc.IDs, int64(t.padID), padding)
	}
	first := 0
	if t.padLeft {
		first = padding
	}
	for i := first; i < first+n; i++ {
		enc.Mask[i] = 1
	}
	return enc, nil
}

func appendRepeat(dst []int64, v int64, n int) []int64 {
	for range n {
		dst = append(dst, v)
	}
	return dst
}

// encodeSequence returns the ids of text without special tokens. With stopAt ≥ 0 it may stop
// once it has at least stopAt ids: the first stopAt are then final, since a piece's tokens never
// depend on the text after it.
func (t *Tokenizer) encodeSequence(text string, stopAt int) []int32 {
	ids := make([]int32, 0, min(len(text)/3+8, 1<<16))
	sc := getScratch()
	defer putScratch(sc)
	more := func() bool { return stopAt < 0 || len(ids) < stopAt }
	addID := func(id int32) bool {
		ids = append(ids, id)
		return more()
	}
	addPiece := func(piece string) bool {
		ids = t.model.tokenize(piece, ids, sc)
		return more()
	}
	preTokenize := func(part string) bool { return t.pre.run(0, part, addPiece) }
	splitAdded(text, t.rawTrie, t.added, func(seg string) bool {
		if t.norm != nil {
			seg = t.norm.normalize(seg)
		}
		return splitAdded(seg, t.normTrie, t.added, preTokenize, addID)
	}, addID)
	return ids
}

// addToken registers an added token (a later entry with the same content replaces it).
func (t *Tokenizer) addToken(a addedToken) {
	if t.addedIndex == nil {
		t.addedIndex = map[string]int{}
		t.addedByID = map[int32]int{}
	}
	if i, ok := t.addedIndex[a.Content]; ok {
		delete(t.addedByID, t.added[i].ID)
		t.added[i] = a
	} else {
		t.addedIndex[a.Content] = len(t.added)
		t.added = append(t.added, a)
	}
	t.addedByID[a.ID] = t.addedIndex[a.Content]
}

// nextID is the id transformers gives a token it adds: one past the largest id in use.
func (t *Tokenizer) nextID() int32 {
	next := t.model.maxID + 1
	for _, a := range t.added {
		next = max(next, a.ID+1)
	}
	return next
}

// rebuildTries indexes the added tokens for matching; normalized ones are matched in their
// normalized form.
func (t *Tokenizer) rebuildTries() {
	raw := make([]string, len(t.added))
	normd := make([]string, len(t.added))
	for i, a := range t.added {
		if !a.Normalized {
			raw[i] = a.Content
			continue
		}
		normd[i] = a.Content
		if t.norm != nil {
			normd[i] = t.norm.normalize(a.Content)
		}
	}
	t.rawTrie = newTokenTrie(raw)
	t.normTrie = newTokenTrie(normd)
}

// TokenToID returns the id of a token (an added token's content or a vocabulary entry).
func (t *Tokenizer) TokenToID(token string) (int32, bool) {
	if i, ok := t.addedIndex[token]; ok {
		return t.added[i].ID, true
	}
	id, ok := t.model.vocab[token]
	return id, ok
}

// IDToToken returns the token with this id.
func (t *Tokenizer) IDToToken(id int32) (string, bool) {
	if i, ok := t.addedByID[id]; ok {
		return t.added[i].Content, true
	}
	return t.model.token(id)
}

// VocabSize returns the number of ids in use: the model vocabulary and the added tokens.
func (t *Tokenizer) VocabSize() int {
	n := len(t.model.vocab)
	for _, a := range t.added {
		if _, ok := t.model.vocab[a.Content]; !ok {
			n++
		}
	}
	return n
}

// PadID returns the pad token's id, if the tokenizer has one.
func (t *Tokenizer) PadID() (int32, bool) { return t.padID, t.hasPad }

// ModelMaxLength returns tokenizer_config.json's model_max_length (0 when unset or unlimited).
func (t *Tokenizer) ModelMaxLength() int { return t.modelMaxLength }

// SpecialTokenCount returns how many ids the post-processor adds to one sequence (1 for the
// Llama tokenizer's BOS, 2 for CLIP's start and end tokens).
func (t *Tokenizer) SpecialTokenCount() int { return t.post.added() }

const (
	stepByteLevel    = iota // bytes from the byte-level alphabet, joined
	stepBPESuffix           // tokens' end-of-word suffix becomes a space (none after the last)
	stepReplaceStrip        // transformers' CLIP decode: suffix → space, then strip
)

type decodeStep struct {
	kind int
	arg  string
}

// Decode turns ids back into text (tokenizers' decode; no clean-up of spaces). Added tokens are
// written as their content, or left out when skipSpecial is set and they are special. Bytes that
// do not form valid UTF-8 (ids cut inside a character) become U+FFFD.
func (t *Tokenizer) Decode(ids []int64, skipSpecial bool) (string, error) {
	if t.decoderErr != nil {
		return "", fmt.Errorf("decode: %w", t.decoderErr)
	}
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id > 1<<31-1 {
			return "", fmt.Errorf("decode: %w: %d", ErrUnknownID, id)
		}
		if i, ok := t.addedByID[int32(id)]; ok {
			if skipSpecial && t.added[i].Special {
				continue
			}
			tokens = append(tokens, t.added[i].Content)
			continue
		}
		tok, ok := t.IDToToken(int32(id))
		if !ok {
			return "", fmt.Errorf("decode: %w: %d", ErrUnknownID, id)
		}
		tokens = append(tokens, tok)
	}
	if len(t.decoder) == 0 {
		return strings.Join(tokens, " "), nil
	}
	for _, step := range t.decoder {
		switch step.kind {
		case stepByteLevel:
			var b []byte
			for _, tok := range tokens {
				b = appendFromByteLevel(b, tok)
			}
			tokens = []string{strings.ToValidUTF8(string(b), "\uFFFD")}
		case stepBPESuffix:
			for i := range tokens {
				rep := " "
				if i == len(tokens)-1 {
					rep = ""
				}
				tokens[i] = strings.ReplaceAll(tokens[i], step.arg, rep)
			}
		case stepReplaceStrip:
			s := strings.Join(tokens, "")
			tokens = []string{strings.TrimSpace(strings.ReplaceAll(s, step.arg, " "))}
		}
	}
	return strings.Join(tokens, ""), nil
}
