package tokenizer

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"golang.org/x/text/unicode/norm"
)

func TestInvalidUTF8(t *testing.T) {
	p := fixtureTokenizers(t)
	for _, s := range []string{"abc\xff", "\xc3", "ok \xed\xa0\x80 surrogate", "\xf4\x90\x80\x80"} {
		_, err := p.Llama.Encode(s, Options{})
		if !errors.Is(err, ErrInvalidPrompt) {
			t.Errorf("Llama.Encode(%q): err = %v, want ErrInvalidPrompt", s, err)
		}
		_, err = p.Encode(s, DefaultPromptConfig())
		if !errors.Is(err, ErrInvalidPrompt) {
			t.Errorf("PromptTokenizer.Encode(%q): err = %v, want ErrInvalidPrompt", s, err)
		}
	}
	_, err := p.Llama.Encode("abc\xff", Options{})
	if err == nil || !strings.Contains(err.Error(), "byte 3") {
		t.Errorf("error %v should give the offset (byte 3)", err)
	}
}

func TestNULIsTokenised(t *testing.T) {
	p := fixtureTokenizers(t)
	nulID, ok := p.Llama.TokenToID(byteString[0])
	if !ok {
		t.Fatal("the byte-level alphabet has no token for byte 0")
	}
	enc, err := p.Llama.Encode("a\x00b", Options{NoSpecialTokens: true})
	if err != nil {
		t.Fatal(err)
	}
	// Pre-tokenised as "a", "\x00b" (the NUL is a non-letter before a word).
	a, _ := p.Llama.Encode("a", Options{NoSpecialTokens: true})
	nb, _ := p.Llama.Encode("\x00b", Options{NoSpecialTokens: true})
	if want := append(a.IDs, nb.IDs...); !equalIDs(enc.IDs, want) {
		t.Errorf("ids %v, want %v", enc.IDs, want)
	}
	if first, _ := p.Llama.Encode("\x00", Options{NoSpecialTokens: true}); !equalIDs(first.IDs, []int64{int64(nulID)}) {
		t.Errorf("a lone NUL is %v, want the byte-0 token %d", first.IDs, nulID)
	}
	back, err := p.Llama.Decode(enc.IDs, false)
	if err != nil || back != "a\x00b" {
		t.Errorf("decode = %q, %v; want the NUL back", back, err)
	}
	clip, err := p.CLIP.Encode("a\x00b", Options{NoSpecialTokens: true})
	if err != nil {
		t.Fatal(err)
	}
	// CLIP: "a" letters, "\x00" other, "b" letters; each piece ends with </w>.
	want := []int64{tokID(t, p.CLIP, "a</w>"), tokID(t, p.CLIP, byteString[0]+"</w>"), tokID(t, p.CLIP, "b</w>")}
	if !equalIDs(clip.IDs, want) {
		t.Errorf("CLIP ids %v, want %v", clip.IDs, want)
	}
}

func tokID(t *testing.T, tok *Tokenizer, s string) int64 {
	t.Helper()
	id, ok := tok.TokenToID(s)
	if !ok {
		t.Fatalf("no token %q", s)
	}
	return int64(id)
}

// TestTruncationStopsEarlyExactly checks that stopping once max_length ids are certain gives the
// ids of tokenising everything and cutting, for many lengths and texts.
func TestTruncationStopsEarlyExactly(t *testing.T) {
	p := fixtureTokenizers(t)
	rng := rand.New(rand.NewPCG(3, 4))
	words := []string{"The", " girl", " dances", "  ", "\n\n", "1234567", " émojis", " 🎉", "<|eot_id|>", "'s", "!!!", " café", "\t", "我爱北京"}
	for i := range 200 {
		var b strings.Builder
		for range rng.IntN(60) {
			b.WriteString(words[rng.IntN(len(words))])
		}
		text := b.String()
		for _, tok := range []*Tokenizer{p.Llama, p.CLIP} {
			full, err := tok.Encode(text, Options{NoSpecialTokens: true})
			if err != nil {
				t.Fatal(err)
			}
			maxLen := 2 + rng.IntN(40)
			got, err := tok.Encode(text, Options{Truncate: true, MaxLength: maxLen})
			if err != nil {
				t.Fatal(err)
			}
			limit := min(maxLen-tok.SpecialTokenCount(), len(full.IDs))
			want := append(append(toInt64(tok.post.prefix), full.IDs[:limit]...), toInt64(tok.post.suffix)...)
			if !equalIDs(got.IDs, want) {
				t.Fatalf("text %d %q max %d:\n got %v\nwant %v", i, text, maxLen, got.IDs, want)
			}
		}
	}
}

func TestHugePrompt(t *testing.T) {
	p := fixtureTokenizers(t)
	unit := "A cat sits on a red chair; the sunlight moves slowly across the room. 1234567 émojis 🎉\n"
	huge := strings.Repeat(unit, (1<<20)/len(unit)+1)
	got, err := p.Encode(huge, DefaultPromptConfig())
	if err != nil {
		t.Fatal(err)
	}
	// Truncation keeps the start: the same ids as a prompt cut to 10 kB.
	want, err := p.Encode(huge[:10*len(unit)*10], DefaultPromptConfig())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("1 MB prompt tokens differ from those of its first 10 kB")
	}
	if len(got.LlamaIDs) != 351 || len(got.CLIPIDs) != 77 || got.LlamaMask[350] != 1 {
		t.Errorf("lengths %d, %d (mask end %d), want 351 full and 77", len(got.LlamaIDs), len(got.CLIPIDs), got.LlamaMask[350])
	}
	// One 1 MB word (no spaces, no letters): a single BPE piece, n·log n merges.
	for _, s := range []string{strings.Repeat("!", 1<<20), strings.Repeat("ab", 1<<19), strings.Repeat(" ", 1<<20), strings.Repeat("\n", 1<<20)} {
		enc, err := p.Encode(s, DefaultPromptConfig())
		if err != nil {
			t.Fatal(err)
		}
		if len(enc.LlamaIDs) != 351 || len(enc.CLIPIDs) != 77 {
			t.Errorf("lengths %d, %d", len(enc.LlamaIDs), len(enc.CLIPIDs))
		}
	}
}

func TestPaddingAndTruncationSides(t *testing.T) {
	spec := miniSpec{Pre: byteLevelPreJSON, Extra: []string{"<s>", "<pad>"},
		Added: []addedToken{{ID: 256, Content: "<s>", Special: true}, {ID: 257, Content: "<pad>", Special: true}},
		Post: map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":           []any{},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{256}, "tokens": []string{"<s>"}}}}}
	data := spec.json(t)
	abc := []int64{'a', 'b', 'c'} // miniSpec: a byte's token has the byte's value as id
	tests := []struct {
		name   string
		config string
		opt    Options
		ids    []int64
		mask   []int64
	}{
		{"right", `{"pad_token": "<pad>"}`, Options{Pad: true, Truncate: true, MaxLength: 6},
			[]int64{256, abc[0], abc[1], abc[2], 257, 257}, []int64{1, 1, 1, 1, 0, 0}},
		{"left", `{"pad_token": "<pad>", "padding_side": "left"}`, Options{Pad: true, Truncate: true, MaxLength: 6},
			[]int64{257, 257, 256, abc[0], abc[1], abc[2]}, []int64{0, 0, 1, 1, 1, 1}},
		{"truncate right", `{"pad_token": "<pad>"}`, Options{Pad: true, Truncate: true, MaxLength: 3},
			[]int64{256, abc[0], abc[1]}, []int64{1, 1, 1}},
		{"truncate left", `{"pad_token": "<pad>", "truncation_side": "left"}`, Options{Pad: true, Truncate: true, MaxLength: 3},
			[]int64{256, abc[1], abc[2]}, []int64{1, 1, 1}},
		{"model_max_length", `{"pad_token": "<pad>", "model_max_length": 5}`, Options{Pad: true, Truncate: true},
			[]int64{256, abc[0], abc[1], abc[2], 257}, []int64{1, 1, 1, 1, 0}},
		{"pad without truncation keeps long input", `{"pad_token": "<pad>"}`, Options{Pad: true, MaxLength: 2},
			[]int64{256, abc[0], abc[1], abc[2]}, []int64{1, 1, 1, 1}},
		{"no special tokens", `{}`, Options{NoSpecialTokens: true}, abc, []int64{1, 1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := LoadDir(writeDir(t, map[string][]byte{"tokenizer.json": data, "tokenizer_config.json": []byte(tc.config)}))
			if err != nil {
				t.Fatal(err)
			}
			enc, err := tok.Encode("abc", tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if !equalIDs(enc.IDs, tc.ids) || !equalIDs(enc.Mask, tc.mask) {
				t.Errorf("ids %v mask %v, want %v %v", enc.IDs, enc.Mask, tc.ids, tc.mask)
			}
		})
	}
	tok, err := ParseJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tok.Encode("abc", Options{Pad: true, MaxLength: 8}); !errors.Is(err, ErrNoPadToken) {
		t.Errorf("padding without a pad token: err = %v", err)
	}
	if _, err := tok.Encode("abc", Options{Truncate: true}); err == nil {
		t.Error("truncation without any max length should fail")
	}
	if _, err := tok.Encode("abc", Options{Truncate: true, MaxLength: -1}); err == nil {
		t.Error("a negative max length should fail")
	}
}

func TestBPEOptions(t *testing.T) {
	plain := func(vocab string, merges string, model string) *Tokenizer {
		t.Helper()
		doc := `{"model": {"type": "BPE", "vocab": ` + vocab + `, "merges": ` + merges + model + `}}`
		tok, err := ParseJSON([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	enc := func(tok *Tokenizer, s string) []int64 {
		t.Helper()
		e, err := tok.Encode(s, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return e.IDs
	}
	vocab := `{"a": 0, "b": 1, "c": 2, "bc": 3, "abc": 4, "<unk>": 5, "<0x78>": 6, "<0x79>": 7}`
	// "abc" is in the vocabulary but no merge builds it: merges give a + bc, ignore_merges takes the word.
	if got := enc(plain(vocab, `["b c"]`, ``), "abc"); !equalIDs(got, []int64{0, 3}) {
		t.Errorf("merges: %v", got)
	}
	if got := enc(plain(vocab, `["b c"]`, `, "ignore_merges": true`), "abc"); !equalIDs(got, []int64{4}) {
		t.Errorf("ignore_merges: %v", got)
	}
	if got := enc(plain(vocab, `[]`, `, "unk_token": "<unk>"`), "axzb"); !equalIDs(got, []int64{0, 5, 5, 1}) {
		t.Errorf("unk: %v", got)
	}
	if got := enc(plain(vocab, `[]`, `, "unk_token": "<unk>", "fuse_unk": true`), "axzb"); !equalIDs(got, []int64{0, 5, 1}) {
		t.Errorf("fuse_unk: %v", got)
	}
	if got := enc(plain(vocab, `[]`, ``), "axzb"); !equalIDs(got, []int64{0, 1}) {
		t.Errorf("no unk drops unknown characters: %v", got)
	}
	if got := enc(plain(vocab, `[]`, `, "byte_fallback": true, "unk_token": "<unk>"`), "axyz"); !equalIDs(got, []int64{0, 6, 7, 5}) {
		t.Errorf("byte_fallback: %v", got)
	}
	// continuing_subword_prefix and end_of_word_suffix.
	wp := plain(`{"a": 0, "##b": 1, "##c</w>": 2, "ab": 3, "abc</w>": 4, "##b</w>": 5}`, `["a ##b", "ab ##c</w>"]`,
		`, "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"`)
	if got := enc(wp, "abc"); !equalIDs(got, []int64{4}) {
		t.Errorf("prefix and suffix: %v", got)
	}
	if got := enc(wp, "ab"); !equalIDs(got, []int64{0, 5}) {
		t.Errorf("prefix and suffix, short word: %v", got)
	}
}

// naiveMerge is the textbook BPE loop: merge the lowest-ranked adjacent pair (leftmost among
// equals) until none is left.
func naiveMerge(m *bpeModel, ids []int32) []int32 {
	ids = append([]int32(nil), ids...)
	for {
		best, bestRank := -1, uint32(0)
		for i := 0; i+1 < len(ids); i++ {
			if rank, _, ok := m.pairMerge(ids[i], ids[i+1]); ok && (best < 0 || rank < bestRank) {
				best, bestRank = i, rank
			}
		}
		if best < 0 {
			return ids
		}
		_, newID, _ := m.pairMerge(ids[best], ids[best+1])
		ids = append(append(ids[:best], newID), ids[best+2:]...)
	}
}

func TestHeapMergeMatchesNaiveMerge(t *testing.T) {
	m := fixtureTokenizers(t).Llama.model
	rng := rand.New(rand.NewPCG(5, 6))
	pieces := []string{"ing", "the", " ", "er", "a", "q", "zz", "\xc3\xa9", "\xf0\x9f", "1", "!", "ĠĠ", "tion", "e"}
	sc := &scratch{}
	for i := range 5000 {
		var b strings.Builder
		for range 1 + rng.IntN(16) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		w := b.String()
		syms := m.initSymbols(w, sc)
		init := make([]int32, len(syms))
		for j, s := range syms {
			init[j] = s.id
		}
		want := naiveMerge(m, init)
		m.mergeAll(syms, sc)
		var got []int32
		for j := int32(0); j >= 0; j = syms[j].next {
			got = append(got, syms[j].id)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("word %d %q: heap %v, naive %v", i, w, got, want)
		}
	}
}

func TestAddedTokenFlags(t *testing.T) {
	base := miniSpec{Pre: byteLevelPreJSON, Extra: []string{"<mask>", "ab", "hello"}, Merges: nil}
	ids := func(tok *Tokenizer, s string) []int64 {
		t.Helper()
		e, err := tok.Encode(s, Options{NoSpecialTokens: true})
		if err != nil {
			t.Fatal(err)
		}
		return e.IDs
	}
	// miniSpec: a byte's token has the byte's value as id.
	const mask, space, x, a, b = 256, ' ', 'x', 'a', 'b'

	plain := base
	plain.Added = []addedToken{{ID: 256, Content: "<mask>", Special: true}}
	if got := ids(plain.parse(t), "x <mask> x"); !equalIDs(got, []int64{x, space, mask, space, x}) {
		t.Errorf("plain: %v", got)
	}
	strip := base
	strip.Added = []addedToken{{ID: 256, Content: "<mask>", Special: true, LStrip: true, RStrip: true}}
	if got := ids(strip.parse(t), "x <mask> x"); !equalIDs(got, []int64{x, mask, x}) {
		t.Errorf("lstrip+rstrip: %v", got)
	}
	single := base
	single.Added = []addedToken{{ID: 257, Content: "ab", SingleWord: true}}
	if got := ids(single.parse(t), "xab ab"); !equalIDs(got, []int64{x, a, b, space, 257}) {
		t.Errorf("single_word: %v", got)
	}
	norm := base
	norm.Normalizer = map[string]any{"type": "Lowercase"}
	norm.Added = []addedToken{{ID: 258, Content: "Hello", Normalized: true}}
	if got := ids(norm.parse(t), "HELLO"); !equalIDs(got, []int64{258}) {
		t.Errorf("normalized token: %v", got)
	}
	// Leftmost-longest: "<mask>" wins over "<m" starting at the same place.
	longest := base
	longest.Extra = append(longest.Extra, "<m")
	longest.Added = []addedToken{{ID: 256, Content: "<mask>", Special: true}, {ID: 259, Content: "<m", Special: true}}
	if got := ids(longest.parse(t), "<mask><m"); !equalIDs(got, []int64{256, 259}) {
		t.Errorf("leftmost-longest: %v", got)
	}
}

func TestNormalizers(t *testing.T) {
	tests := []struct {
		name string
		n    normalizer
		in   string
		want string
	}{
		{"lowercase ascii", lowercase{}, "UPPER Case", "upper case"},
		{"lowercase unicode", lowercase{}, "ÉΣİǅ", "éσi\u0307ǆ"},
		{"nfc", unicodeNorm{form: norm.NFC}, "e\u0301", "é"},
		{"whitespace runs", replaceWhitespace{content: " "}, "  a\t\n b\u3000\u00a0c ", " a b c "},
		{"no whitespace", replaceWhitespace{content: " "}, "abc", "abc"},
		{"single spaces", replaceWhitespace{content: " "}, "a b c", "a b c"},
		{"lone tab and nbsp", replaceWhitespace{content: " "}, "a\tb\u00a0", "a b "},
		{"to nothing", replaceWhitespace{content: ""}, "a b  c", "abc"},
		{"strip", strip{left: true, right: true}, " \t a b \n", "a b"},
		{"prepend", prepend{prefix: "▁"}, "a", "▁a"},
		{"prepend empty", prepend{prefix: "▁"}, "", ""},
		{"replace literal", replaceLiteral{pattern: " ", content: "▁"}, "a b c", "a▁b▁c"},
	}
	for _, tc := range tests {
		if got := tc.n.normalize(tc.in); got != tc.want {
			t.Errorf("%s: normalize(%q) = %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
	n, err := parseNormalizer([]byte(`{"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "#"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := n.normalize("a12b3"); got != "a#b#" {
		t.Errorf("regex replace: %q", got)
	}
}

func TestFormatTemplate(t *testing.T) {
	tests := []struct {
		tmpl, arg, want string
		bad             bool
	}{
		{tmpl: "a{}b", arg: "X", want: "aXb"},
		{tmpl: "a{0}b", arg: "X", want: "aXb"},
		{tmpl: "{{}}{}", arg: "{}", want: "{}{}"},
		{tmpl: "x", arg: "y", want: "x"},
		{tmpl: "{name}", bad: true},
		{tmpl: "a}", bad: true},
		{tmpl: "a{", bad: true},
	}
	for _, tc := range tests {
		got, err := FormatTemplate(tc.tmpl, tc.arg)
		if tc.bad != (err != nil) || got != tc.want {
			t.Errorf("FormatTemplate(%q, %q) = %q, %v", tc.tmpl, tc.arg, got, err)
		}
	}
}

// TestTemplatePrefixIsCropStart checks the template's prefix length against the crop_start that
// the fixture's encode cases use, and the default config against the tokenize cases' params.
func TestTemplatePrefixIsCropStart(t *testing.T) {
	fx := parity.Load(t, "textenc")
	p := fixtureTokenizers(t)
	var template string
	var cropStart int
	for _, c := range fx.Cases {
		c.Param(t, "llama_template", &template)
		c.Param(t, "crop_start", &cropStart)
		if c.Op == "tokenize" {
			var cfg PromptConfig
			c.Param(t, "llama_template", &cfg.LlamaTemplate)
			c.Param(t, "llama_max_length", &cfg.LlamaMaxLength)
			c.Param(t, "clip_max_length", &cfg.CLIPMaxLength)
			if cfg != DefaultPromptConfig() {
				t.Errorf("case %s params differ from DefaultPromptConfig", c.Name)
			}
		}
	}
	if template == "" || cropStart == 0 {
		t.Fatal("fixture has no template or crop_start")
	}
	n, err := p.TemplatePrefixLength(template)
	if err != nil {
		t.Fatal(err)
	}
	if n != cropStart || n != HunyuanCropStart {
		t.Errorf("template prefix is %d ids, crop_start %d, HunyuanCropStart %d", n, cropStart, HunyuanCropStart)
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	p := fixtureTokenizers(t)
	for _, s := range []string{"", "Hello  world\n\n", "émojis 🎉 café 我爱北京", "<|eot_id|> text<|begin_of_text|>", "\x00\x01\x7f"} {
		enc, err := p.Llama.Encode(s, Options{NoSpecialTokens: true})
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Llama.Decode(enc.IDs, false)
		if err != nil || got != s {
			t.Errorf("Decode(Encode(%q)) = %q, %v", s, got, err)
		}
	}
	enc, _ := p.Llama.Encode("hi<|eot_id|>", Options{})
	if got, _ := p.Llama.Decode(enc.IDs, true); got != "hi" {
		t.Errorf("skip special: %q", got)
	}
	if _, err := p.Llama.Decode([]int64{1 << 40}, false); !errors.Is(err, ErrUnknownID) {
		t.Errorf("unknown id: %v", err)
	}
	clip, _ := p.CLIP.Encode("A Dog  runs!", Options{})
	if got, _ := p.CLIP.Decode(clip.IDs, true); got != "a dog runs !" {
		t.Errorf("CLIP decode: %q", got)
	}
}

func TestConcurrentEncode(t *testing.T) {
	p := fixtureTokenizers(t)
	prompts := []string{"The girl dances gracefully.", "A cat sits on a red chair", "émojis 🎉 café", benchWords(300)}
	want := make([]PromptTokens, len(prompts))
	for i, s := range prompts {
		var err error
		if want[i], err = p.Encode(s, DefaultPromptConfig()); err != nil {
			t.Fatal(err)
		}
	}
	p.Llama.model.cache.reset()
	p.CLIP.model.cache.reset()
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for k := range 20 {
				i := (g + k) % len(prompts)
				got, err := p.Encode(prompts[i], DefaultPromptConfig())
				if err == nil && !reflect.DeepEqual(got, want[i]) {
					err = errors.New("concurrent result differs for " + prompts[i][:10])
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
