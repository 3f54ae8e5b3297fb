package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
)

// miniSpec describes a small tokenizer.json for tests. Empty component fields mean null; the
// vocabulary is the byte-level alphabet (ids 0..255) followed by extra, in order.
type miniSpec struct {
	Model      map[string]any
	Extra      []string
	Merges     []string
	Normalizer any
	Pre        any
	Post       any
	Decoder    any
	Added      []addedToken
	Padding    any
	Truncation any
}

func (m miniSpec) json(t testing.TB) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b := range 256 {
		vocab[byteString[b]] = b
	}
	for _, e := range m.Extra {
		if _, ok := vocab[e]; !ok {
			vocab[e] = len(vocab)
		}
	}
	model := map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
		"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
		"vocab": vocab, "merges": m.Merges}
	if m.Merges == nil {
		model["merges"] = []string{}
	}
	for k, v := range m.Model {
		model[k] = v
	}
	added := m.Added
	if added == nil {
		added = []addedToken{}
	}
	doc := map[string]any{"version": "1.0", "truncation": m.Truncation, "padding": m.Padding,
		"added_tokens": added, "normalizer": m.Normalizer, "pre_tokenizer": m.Pre,
		"post_processor": m.Post, "decoder": m.Decoder, "model": model}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (m miniSpec) parse(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := ParseJSON(m.json(t))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// byteLevelPreJSON is a ByteLevel pre-tokenizer with the GPT-2 split.
var byteLevelPreJSON = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}

// writeDir writes files into a fresh folder.
func writeDir(t testing.TB, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

var (
	fixtureOnce sync.Once
	fixturePair *PromptTokenizer
	fixtureErr  error
)

// fixtureTokenizers loads the textenc fixture set's tokenizers once per test binary (the Llama
// file takes a noticeable fraction of a second).
func fixtureTokenizers(t testing.TB) *PromptTokenizer {
	t.Helper()
	fixtureOnce.Do(func() {
		root, err := parity.Root()
		if err != nil {
			fixtureErr = err
			return
		}
		fx, err := parity.Open(root, "textenc")
		if err != nil {
			fixtureErr = err
			return
		}
		defer fx.Close()
		llama, err := fx.ModelPath("tokenizer")
		if err != nil {
			fixtureErr = err
			return
		}
		clip, err := fx.ModelPath("tokenizer_2")
		if err != nil {
			fixtureErr = err
			return
		}
		fixturePair, fixtureErr = LoadPromptTokenizer(llama, clip)
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	return fixturePair
}

func toInt64(ids []int32) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = int64(id)
	}
	return out
}
