package tokenizer

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrInvalidPrompt is wrapped by every error about the text given to Encode (not valid UTF-8).
// Workers map it to InvalidArgument.
var ErrInvalidPrompt = errors.New("invalid prompt")

// ErrUnsupported is wrapped by load errors for a tokenizer component this package does not
// implement (a model, normalizer, pre-tokenizer, post-processor or decoder type, or an option such
// as BPE dropout); the message names it.
var ErrUnsupported = errors.New("unsupported tokenizer component")

// ErrUnknownID is wrapped by Decode errors for an id that is neither in the vocabulary nor an
// added token.
var ErrUnknownID = errors.New("unknown token id")

// ErrNoPadToken is returned when padding is asked of a tokenizer without a usable pad token.
var ErrNoPadToken = errors.New("tokenizer has no pad token")

// checkUTF8 returns an error wrapping ErrInvalidPrompt when s is not valid UTF-8.
func checkUTF8(s string) error {
	if utf8.ValidString(s) {
		return nil
	}
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			return fmt.Errorf("%w: not valid UTF-8 at byte %d", ErrInvalidPrompt, i)
		}
		i += n
	}
	return fmt.Errorf("%w: not valid UTF-8", ErrInvalidPrompt)
}

func unsupported(what, name string) error {
	return fmt.Errorf("%w: %s %q", ErrUnsupported, what, name)
}
