package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// File names in a tokenizer folder.
const (
	fileTokenizerJSON = "tokenizer.json"
	fileConfig        = "tokenizer_config.json"
	fileVocab         = "vocab.json"
	fileMerges        = "merges.txt"
)

// LoadDir loads the tokenizer stored in dir: tokenizer.json when there is one, otherwise a CLIP
// vocab.json + merges.txt pair (tokenizer_class CLIPTokenizer, as transformers builds it).
// tokenizer_config.json, when present, supplies the special tokens (added as transformers adds
// them), the pad token, the padding and truncation sides and model_max_length.
func LoadDir(dir string) (*Tokenizer, error) {
	cfg, err := readConfig(filepath.Join(dir, fileConfig))
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", dir, err)
	}
	jsonPath := filepath.Join(dir, fileTokenizerJSON)
	data, err := os.ReadFile(jsonPath)
	var t *Tokenizer
	switch {
	case err == nil:
		t, err = parseTokenizerJSON(data)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", jsonPath, err)
		}
	case errors.Is(err, fs.ErrNotExist):
		t, err = loadCLIPFiles(dir, cfg)
		if err != nil {
			return nil, fmt.Errorf("load tokenizer %s: %w", dir, err)
		}
	default:
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	if err := t.applyConfig(cfg); err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %s: %w", dir, fileConfig, err)
	}
	return t, nil
}

// ParseJSON builds a tokenizer from the contents of a tokenizer.json, with no
// tokenizer_config.json: padding, if asked for, uses the file's padding section.
func ParseJSON(data []byte) (*Tokenizer, error) {
	t, err := parseTokenizerJSON(data)
	if err != nil {
		return nil, err
	}
	if err := t.applyConfig(&tokenizerConfig{}); err != nil {
		return nil, err
	}
	return t, nil
}

type truncationJSON struct {
	Direction string `json:"direction"`
	MaxLength int    `json:"max_length"`
	Strategy  string `json:"strategy"`
}

type paddingJSON struct {
	Strategy  json.RawMessage `json:"strategy"`
	Direction string          `json:"direction"`
	PadID     int32           `json:"pad_id"`
	PadToken  string          `json:"pad_token"`
}

type bpeJSON struct {
	Type                    string   `json:"type"`
	Dropout                 *float64 `json:"dropout"`
	UnkToken                *string  `json:"unk_token"`
	ContinuingSubwordPrefix *string  `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string  `json:"end_of_word_suffix"`
	FuseUnk                 bool     `json:"fuse_unk"`
	ByteFallback            bool     `json:"byte_fallback"`
	IgnoreMerges            bool     `json:"ignore_merges"`
}

type decoderJSON struct {
	Type     string            `json:"type"`
	Suffix   string            `json:"suffix"`
	Decoders []json.RawMessage `json:"decoders"`
}

func parseTokenizerJSON(data []byte) (*Tokenizer, error) {
	sc := &jscan{src: string(data)}
	parts := map[string]json.RawMessage{}
	modelFields := map[string]json.RawMessage{}
	var vocab map[string]int32
	var merges [][2]string
	haveModel, haveMerges := false, false
	err := sc.object(func(key string) error {
		if key != "model" {
			raw, err := sc.raw()
			parts[key] = json.RawMessage(raw)
			return err
		}
		haveModel = true
		return sc.object(func(mkey string) error {
			var err error
			switch {
			case mkey == "vocab" && sc.peek() == '{':
				vocab, err = sc.vocab()
			case mkey == "merges" && sc.peek() == '[':
				haveMerges = true
				merges, err = sc.merges()
			default:
				var raw string
				raw, err = sc.raw()
				modelFields[mkey] = json.RawMessage(raw)
			}
			if err != nil {
				return fmt.Errorf("model.%s: %w", mkey, err)
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	if sc.peek() != 0 {
		return nil, sc.errorf("data after the top-level object")
	}
	if !haveModel {
		return nil, fmt.Errorf("no model section")
	}

	// The model. Files written by old tokenizers versions have no "type"; BPE is the one with merges.
	var mj bpeJSON
	if raw, ok := modelFields["type"]; ok {
		if err := json.Unmarshal(raw, &mj.Type); err != nil {
			return nil, fmt.Errorf("model.type: %w", err)
		}
	} else if haveMerges {
		mj.Type = "BPE"
	}
	if mj.Type != "BPE" {
		return nil, unsupported("model type", mj.Type)
	}
	delete(modelFields, "type")
	rawModel, _ := json.Marshal(modelFields)
	if err := json.Unmarshal(rawModel, &mj); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if mj.Dropout != nil && *mj.Dropout != 0 {
		return nil, fmt.Errorf("%w: BPE dropout %g (tokenisation would be random)", ErrUnsupported, *mj.Dropout)
	}
	if vocab == nil {
		return nil, fmt.Errorf("model: no vocab object")
	}
	opts := bpeOptions{
		unkToken:     mj.UnkToken,
		fuseUnk:      mj.FuseUnk,
		byteFallback: mj.ByteFallback,
		ignoreMerges: mj.IgnoreMerges,
	}
	if mj.ContinuingSubwordPrefix != nil {
		opts.prefix = *mj.ContinuingSubwordPrefix
	}
	if mj.EndOfWordSuffix != nil {
		opts.suffix = *mj.EndOfWordSuffix
	}
	model, err := newBPE(vocab, merges, opts)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}

	t := &Tokenizer{model: model}
	if t.norm, err = parseNormalizer(parts["normalizer"]); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(parts["pre_tokenizer"]); err != nil {
		return nil, err
	}
	if t.post, err = parsePostProcessor(parts["post_processor"]); err != nil {
		return nil, err
	}
	if err := t.parseDecoder(parts["decoder"]); err != nil {
		return nil, err
	}
	if raw := parts["added_tokens"]; !isNull(raw) {
		var added []addedToken
		if err := json.Unmarshal(raw, &added); err != nil {
			return nil, fmt.Errorf("added_tokens: %w", err)
		}
		for _, a := range added {
			t.addToken(a)
		}
	}
	if raw := parts["truncation"]; !isNull(raw) {
		var tr truncationJSON
		if err := json.Unmarshal(raw, &tr); err != nil {
			return nil, fmt.Errorf("truncation: %w", err)
		}
		switch tr.Direction {
		case "", "Right":
		case "Left":
			t.truncLeft = true
		default:
			return nil, unsupported("truncation direction", tr.Direction)
		}
		t.fileMaxLength = tr.MaxLength
	}
	if raw := parts["padding"]; !isNull(raw) {
		var pd paddingJSON
		if err := json.Unmarshal(raw, &pd); err != nil {
			return nil, fmt.Errorf("padding: %w", err)
		}
		switch pd.Direction {
		case "", "Right":
		case "Left":
			t.padLeft = true
		default:
			return nil, unsupported("padding direction", pd.Direction)
		}
		var fixed struct {
			Fixed int `json:"Fixed"`
		}
		if json.Unmarshal(pd.Strategy, &fixed) == nil && fixed.Fixed > 0 {
			t.filePadLength = fixed.Fixed
		}
		t.padID, t.padToken = pd.PadID, pd.PadToken
	}
	if t.pre.byteLevel {
		model.setByteLevel()
	}
	return t, nil
}

func (t *Tokenizer) parseDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var add func(raw json.RawMessage) error
	add = func(raw json.RawMessage) error {
		var d decoderJSON
		if err := json.Unmarshal(raw, &d); err != nil {
			return fmt.Errorf("decoder: %w", err)
		}
		switch d.Type {
		case "ByteLevel":
			t.decoder = append(t.decoder, decodeStep{kind: stepByteLevel})
		case "BPEDecoder":
			t.decoder = append(t.decoder, decodeStep{kind: stepBPESuffix, arg: d.Suffix})
		case "Sequence":
			for _, sub := range d.Decoders {
				if err := add(sub); err != nil {
					return err
				}
			}
		default:
			// Encoding does not need the decoder: keep the tokenizer usable, fail Decode only.
			t.decoderErr = unsupported("decoder", d.Type)
		}
		return nil
	}
	return add(raw)
}

// tokenizerConfig is the part of transformers' tokenizer_config.json that matters here.
type tokenizerConfig struct {
	TokenizerClass     string                `json:"tokenizer_class"`
	BOS                configToken           `json:"bos_token"`
	EOS                configToken           `json:"eos_token"`
	UNK                configToken           `json:"unk_token"`
	PAD                configToken           `json:"pad_token"`
	SEP                configToken           `json:"sep_token"`
	CLS                configToken           `json:"cls_token"`
	Mask               configToken           `json:"mask_token"`
	ModelMaxLength     *float64              `json:"model_max_length"`
	PaddingSide        string                `json:"padding_side"`
	TruncationSide     string                `json:"truncation_side"`
	AddedTokensDecoder map[string]addedToken `json:"added_tokens_decoder"`
}

// configToken is a special token in tokenizer_config.json: a string, an AddedToken object, or null.
type configToken struct {
	set   bool
	token addedToken
}

func (c *configToken) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		*c = configToken{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		// transformers: a plain string is AddedToken(s, special=True), so normalized=False.
		*c = configToken{set: true, token: addedToken{Content: s, Special: true}}
		return nil
	}
	var obj struct {
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized *bool  `json:"normalized"`
	}
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	*c = configToken{set: true, token: addedToken{Content: obj.Content, SingleWord: obj.SingleWord,
		LStrip: obj.LStrip, RStrip: obj.RStrip, Special: true}}
	if obj.Normalized != nil {
		c.token.Normalized = *obj.Normalized
	}
	return nil
}

func readConfig(path string) (*tokenizerConfig, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &tokenizerConfig{}, nil
	}
	if err != nil {
		return nil, err
	}
	cfg := &tokenizerConfig{}
	if err := json.Unmarshal(data, cfg); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return cfg, nil
}

// applyConfig adds the config's special tokens as transformers does, and settles the pad token,
// the sides and model_max_length.
func (t *Tokenizer) applyConfig(cfg *tokenizerConfig) error {
	ids := make([]int, 0, len(cfg.AddedTokensDecoder))
	for k := range cfg.AddedTokensDecoder {
		id, err := strconv.Atoi(k)
		if err != nil {
			return fmt.Errorf("added_tokens_decoder: key %q is not an id", k)
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		a := cfg.AddedTokensDecoder[strconv.Itoa(id)]
		if _, ok := t.addedIndex[a.Content]; !ok {
			a.ID = int32(id)
			t.addToken(a)
		}
	}
	for _, c := range []configToken{cfg.BOS, cfg.EOS, cfg.UNK, cfg.PAD, cfg.SEP, cfg.CLS, cfg.Mask} {
		if !c.set || c.token.Content == "" {
			continue
		}
		if _, ok := t.addedIndex[c.token.Content]; ok {
			continue
		}
		a := c.token
		if id, ok := t.model.vocab[a.Content]; ok {
			a.ID = id
		} else {
			a.ID = t.nextID()
		}
		t.addToken(a)
	}
	t.rebuildTries()

	if cfg.PAD.set {
		t.padToken = cfg.PAD.token.Content
		id, ok := t.TokenToID(t.padToken)
		if !ok {
			return fmt.Errorf("pad token %q is not in the vocabulary", t.padToken)
		}
		t.padID = id
	}
	if t.padToken != "" {
		t.hasPad = true
	}
	switch cfg.PaddingSide {
	case "":
	case "right":
		t.padLeft = false
	case "left":
		t.padLeft = true
	default:
		return fmt.Errorf("padding_side %q", cfg.PaddingSide)
	}
	switch cfg.TruncationSide {
	case "":
	case "right":
		t.truncLeft = false
	case "left":
		t.truncLeft = true
	default:
		return fmt.Errorf("truncation_side %q", cfg.TruncationSide)
	}
	// transformers writes VERY_LARGE_INTEGER (1e30) when a model has no limit.
	if m := cfg.ModelMaxLength; m != nil && *m > 0 && *m < math.MaxInt32 {
		t.modelMaxLength = int(*m)
	}
	return nil
}

// loadCLIPFiles builds transformers 5's CLIPTokenizer from vocab.json and merges.txt: NFC,
// whitespace runs to one space, lower case; split on CLIP's pattern keeping only the matches;
// byte-level BPE with "</w>" ending each word; <|startoftext|> A <|endoftext|>.
func loadCLIPFiles(dir string, cfg *tokenizerConfig) (*Tokenizer, error) {
	switch cfg.TokenizerClass {
	case "", "CLIPTokenizer", "CLIPTokenizerFast":
	default:
		return nil, fmt.Errorf("%w: tokenizer_class %q without %s", ErrUnsupported, cfg.TokenizerClass, fileTokenizerJSON)
	}
	vocabPath := filepath.Join(dir, fileVocab)
	data, err := os.ReadFile(vocabPath)
	if err != nil {
		return nil, fmt.Errorf("no %s and %w", fileTokenizerJSON, err)
	}
	sc := &jscan{src: string(data)}
	vocab, err := sc.vocab()
	if err == nil && sc.peek() != 0 {
		err = sc.errorf("data after the vocabulary")
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", vocabPath, err)
	}
	mergesPath := filepath.Join(dir, fileMerges)
	mdata, err := os.ReadFile(mergesPath)
	if err != nil {
		return nil, err
	}
	merges, err := parseMergesTxt(string(mdata))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", mergesPath, err)
	}
	name := func(c configToken, def string) string {
		if c.set && c.token.Content != "" {
			return c.token.Content
		}
		return def
	}
	bos := name(cfg.BOS, "<|startoftext|>")
	eos := name(cfg.EOS, "<|endoftext|>")
	unk := name(cfg.UNK, "<|endoftext|>")
	model, err := newBPE(vocab, merges, bpeOptions{unkToken: &unk, suffix: "</w>"})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	bosID, okB := vocab[bos]
	eosID, okE := vocab[eos]
	if !okB || !okE {
		return nil, fmt.Errorf("bos %q or eos %q is not in %s", bos, eos, fileVocab)
	}
	t := &Tokenizer{
		model: model,
		norm:  normalizerSeq{unicodeNorm{norm.NFC}, replaceWhitespace{content: " "}, lowercase{}},
		pre: parsedPre{steps: []preTokenizer{
			&splitPre{f: clipFinder{}, behavior: behaviorRemoved, invert: true},
			&byteLevelPre{},
		}, byteLevel: true},
		post:    postProcess{prefix: []int32{bosID}, suffix: []int32{eosID}},
		decoder: []decodeStep{{kind: stepByteLevel}, {kind: stepReplaceStrip, arg: "</w>"}},
	}
	model.setByteLevel()
	special := func(c *configToken, content string) {
		if !c.set {
			*c = configToken{set: true, token: addedToken{Content: content, Special: true}}
		}
	}
	special(&cfg.BOS, bos)
	special(&cfg.EOS, eos)
	special(&cfg.UNK, unk)
	special(&cfg.PAD, "<|endoftext|>") // CLIPTokenizer's default pad token
	return t, nil
}

// parseMergesTxt reads merges.txt as tokenizers' BPE::read_file: lines starting with "#version"
// are skipped, every other line is two tokens separated by one space.
func parseMergesTxt(s string) ([][2]string, error) {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil, nil
	}
	lines := strings.Split(s, "\n")
	merges := make([][2]string, 0, len(lines))
	for i, line := range lines {
		line = strings.TrimSuffix(line, "\r")
		if strings.HasPrefix(line, "#version") {
			continue
		}
		a, b, ok := strings.Cut(line, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("line %d: %q is not two tokens separated by one space", i+1, line)
		}
		merges = append(merges, [2]string{a, b})
	}
	return merges, nil
}
