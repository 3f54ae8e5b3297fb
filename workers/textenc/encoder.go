package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/tokenizer"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/workers/textenc/clip"
	"github.com/framepackd/framepackd/workers/textenc/llama"
)

// LlamaHiddenStateIndex is the Llama hidden-states entry FramePack conditions on
// (encode_prompt_conds: hidden_states[-3]).
const LlamaHiddenStateIndex = -3

// Defaults of a text_encode stage, FramePack's values.
const (
	DefaultLlamaMaxLength = 256
	DefaultCLIPMaxLength  = 77
	DefaultCropStart      = tokenizer.HunyuanCropStart
	DefaultPadLength      = 512

	// maxPadLength bounds pad_length (the output rows) so a request cannot ask for gigabytes.
	maxPadLength = 1 << 16
	// maxLlamaPositions bounds llama_max_length + crop_start when the config gives no
	// max_position_embeddings.
	maxLlamaPositions = 1 << 14
)

// ErrInvalidArgument is wrapped by errors the worker reports as ERROR_CODE_INVALID_ARGUMENT.
var ErrInvalidArgument = workerkit.ErrInvalidArgument

// Paths are the folders of a HunyuanVideo snapshot the encoder loads.
type Paths struct {
	TextEncoder  string // LlamaModel: config.json + safetensors
	TextEncoder2 string // CLIPTextModel
	Tokenizer    string // Llama 3 tokenizer.json
	Tokenizer2   string // CLIP vocab.json + merges.txt
}

// SnapshotPaths returns the standard sub-folders of a HF snapshot folder.
func SnapshotPaths(root string) Paths {
	return Paths{
		TextEncoder:  filepath.Join(root, "text_encoder"),
		TextEncoder2: filepath.Join(root, "text_encoder_2"),
		Tokenizer:    filepath.Join(root, "tokenizer"),
		Tokenizer2:   filepath.Join(root, "tokenizer_2"),
	}
}

// Encoder is HunyuanVideo's pair of text encoders with their tokenizers: FramePack's
// encode_prompt_conds plus the padding to a fixed length that its worker applies.
type Encoder struct {
	rt    *runtime.Runtime
	tok   *tokenizer.PromptTokenizer
	Llama *llama.Model
	CLIP  *clip.Model
	// TemplatePrefix is the number of Llama ids the prompt template puts before the prompt with
	// this tokenizer (95 for HunyuanVideo's; a different count means crop_start 95 cuts the
	// conditioning in the wrong place).
	TemplatePrefix int
}

// LoadEncoder loads tokenizers and models into rt. The weight matrices (Linear weights, CLIP's
// token embedding: nearly all the bytes) are kept as wdt: F32, F16, BF16 or runtime.AsStored
// (the checkpoints' own dtype); norms, biases and activations are f32 (LoadEncoderWith chooses
// another activation dtype).
func LoadEncoder(rt *runtime.Runtime, p Paths, wdt runtime.DType) (*Encoder, error) {
	return LoadEncoderWith(rt, p, Residency{WeightDType: wdt})
}

// Residency is how LoadEncoderWith places the weights: their dtype, and the memory cap and
// layer limit the Llama layer residency is planned for (layers that do not fit stream from
// host memory).
type Residency struct {
	// ActivationDType is both models' activation dtype (0: F32; FramePack runs its text
	// encoders in fp16); outputs come back as float32 whatever it is.
	ActivationDType runtime.DType
	WeightDType     runtime.DType
	// MemoryCap is the runtime's cap (0: none): CLIP, Llama's resident layers and slots, and
	// the activations' estimate must fit it.
	MemoryCap int64
	// MaxResidentLayers caps the Llama layers kept resident (0: as many as fit;
	// llama.NoResidentLayers: none).
	MaxResidentLayers int
}

// llamaTokens bounds the Llama sequence the activation estimate is made for: FramePack's 256
// prompt tokens after the 95-token template, rounded up.
const llamaTokens = 512

// LoadEncoderWith is LoadEncoder with layer streaming: CLIP loads first, then Llama with the
// rest of the cap, less its activation estimate, planned for its layers.
func LoadEncoderWith(rt *runtime.Runtime, p Paths, r Residency) (*Encoder, error) {
	tok, err := tokenizer.LoadPromptTokenizer(p.Tokenizer, p.Tokenizer2)
	if err != nil {
		return nil, fmt.Errorf("load tokenizers: %w", err)
	}
	prefix, err := tok.TemplatePrefixLength(tokenizer.HunyuanTemplate)
	if err != nil {
		return nil, fmt.Errorf("load tokenizers: template: %w", err)
	}
	cm, err := clip.Load(rt, p.TextEncoder2, clip.Options{DType: r.ActivationDType, WeightDType: r.WeightDType})
	if err != nil {
		return nil, fmt.Errorf("load text_encoder_2: %w", err)
	}
	lo := llama.Options{HiddenStateIndex: LlamaHiddenStateIndex, Options: nn.Options{DType: r.ActivationDType, WeightDType: r.WeightDType},
		MaxResidentLayers: r.MaxResidentLayers}
	if r.MemoryCap > 0 {
		cfg, err := llama.LoadConfig(p.TextEncoder)
		if err != nil {
			cm.Close()
			return nil, fmt.Errorf("load text_encoder: %w", err)
		}
		lo.MemoryCap = r.MemoryCap - int64(rt.Memory().Allocated)
		lo.ActivationBytes = cfg.ActivationBytes(llamaTokens)
	}
	lm, err := llama.Load(rt, p.TextEncoder, lo)
	if err != nil {
		cm.Close()
		if r.MemoryCap > 0 {
			return nil, fmt.Errorf("load text_encoder (the worker's cap is %d bytes; CLIP took %d of it, Llama had the rest): %w",
				r.MemoryCap, r.MemoryCap-lo.MemoryCap, err)
		}
		return nil, fmt.Errorf("load text_encoder: %w", err)
	}
	return &Encoder{rt: rt, tok: tok, Llama: lm, CLIP: cm, TemplatePrefix: prefix}, nil
}

// Close frees both models.
func (e *Encoder) Close() error {
	err := e.Llama.Close()
	if cerr := e.CLIP.Close(); err == nil {
		err = cerr
	}
	return err
}

// WeightBytes is the size of the weights held in the runtime.
func (e *Encoder) WeightBytes() int64 { return e.Llama.WeightBytes() + e.CLIP.WeightBytes() }

// Params are a text_encode stage's lengths; zero fields take the defaults.
type Params struct {
	LlamaMaxLength int // FramePack's max_length: the Llama ids are truncated and padded to it + CropStart
	CLIPMaxLength  int // CLIP ids are truncated and padded to it
	CropStart      int // template ids dropped from the front of the Llama hidden states
	PadLength      int // rows the Llama output is cut or zero-padded to
}

// withDefaults fills zero fields and checks the bounds against the models.
func (e *Encoder) withDefaults(p Params) (Params, error) {
	if p.LlamaMaxLength == 0 {
		p.LlamaMaxLength = DefaultLlamaMaxLength
	}
	if p.CLIPMaxLength == 0 {
		p.CLIPMaxLength = DefaultCLIPMaxLength
	}
	if p.CropStart == 0 {
		p.CropStart = DefaultCropStart
	}
	if p.PadLength == 0 {
		p.PadLength = DefaultPadLength
	}
	maxLlama := e.Llama.Config.MaxPositionEmbeddings
	if maxLlama <= 0 {
		maxLlama = maxLlamaPositions
	}
	switch {
	case p.LlamaMaxLength < 0 || p.CLIPMaxLength < 0 || p.CropStart < 0 || p.PadLength < 0:
		return p, fmt.Errorf("%w: negative length in %+v", ErrInvalidArgument, p)
	case p.LlamaMaxLength+p.CropStart > maxLlama:
		return p, fmt.Errorf("%w: llama_max_length %d + crop_start %d exceeds the text encoder's %d positions",
			ErrInvalidArgument, p.LlamaMaxLength, p.CropStart, maxLlama)
	case p.CLIPMaxLength > e.CLIP.Config.MaxPositionEmbeddings:
		return p, fmt.Errorf("%w: clip_max_length %d exceeds text_encoder_2's %d positions",
			ErrInvalidArgument, p.CLIPMaxLength, e.CLIP.Config.MaxPositionEmbeddings)
	case p.PadLength > maxPadLength:
		return p, fmt.Errorf("%w: pad_length %d exceeds %d", ErrInvalidArgument, p.PadLength, maxPadLength)
	}
	return p, nil
}

// Conds is one prompt's conditioning as the transformer takes it.
type Conds struct {
	// LlamaVec is hidden_states[-3][:, crop_start:n_attended], cut or zero-padded to PadLength
	// rows: [PadLength, LlamaHidden] row-major.
	LlamaVec []float32
	// LlamaMask marks the rows of LlamaVec that hold tokens: [PadLength].
	LlamaMask []bool
	// Rows is the number of Llama rows before padding (n_attended − crop_start).
	Rows int
	// CLIPPooler is CLIPTextModel's pooler_output: [CLIPHidden].
	CLIPPooler []float32
	// Tokens are the ids the models ran on.
	Tokens tokenizer.PromptTokens
}

// Tokenize returns the ids of prompt as encode_prompt_conds makes them. A prompt that is not
// valid UTF-8 gives an error wrapping ErrInvalidArgument.
func (e *Encoder) Tokenize(prompt string, p Params) (tokenizer.PromptTokens, error) {
	p, err := e.withDefaults(p)
	if err != nil {
		return tokenizer.PromptTokens{}, err
	}
	return e.tokenize(prompt, p)
}

func (e *Encoder) tokenize(prompt string, p Params) (tokenizer.PromptTokens, error) {
	cfg := tokenizer.PromptConfig{LlamaTemplate: tokenizer.HunyuanTemplate,
		LlamaMaxLength: p.LlamaMaxLength + p.CropStart, CLIPMaxLength: p.CLIPMaxLength}
	toks, err := e.tok.Encode(prompt, cfg)
	if err != nil {
		if errors.Is(err, tokenizer.ErrInvalidPrompt) {
			return toks, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
		return toks, fmt.Errorf("tokenize: %w", err)
	}
	return toks, nil
}

// Encode runs encode_prompt_conds on prompt and pads the Llama output as
// crop_or_pad_yield_mask does.
func (e *Encoder) Encode(prompt string, p Params) (Conds, error) {
	p, err := e.withDefaults(p)
	if err != nil {
		return Conds{}, err
	}
	toks, err := e.tokenize(prompt, p)
	if err != nil {
		return Conds{}, err
	}
	c, err := e.EncodeTokens(toks, p)
	if errors.Is(err, nn.ErrBadInput) {
		err = fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return c, err
}

// EncodeTokens runs both models on ids made by Tokenize (or given by a test).
func (e *Encoder) EncodeTokens(toks tokenizer.PromptTokens, p Params) (Conds, error) {
	p, err := e.withDefaults(p)
	if err != nil {
		return Conds{}, err
	}
	if len(toks.LlamaIDs) != len(toks.LlamaMask) {
		return Conds{}, fmt.Errorf("%w: %d llama ids and %d mask entries", ErrInvalidArgument, len(toks.LlamaIDs), len(toks.LlamaMask))
	}
	ids := make([]int32, len(toks.LlamaIDs))
	mask := make([]bool, len(toks.LlamaMask))
	nAttended := 0
	for i, v := range toks.LlamaIDs {
		ids[i] = int32(v)
		mask[i] = toks.LlamaMask[i] != 0
		if mask[i] {
			nAttended++
		}
	}
	// llama_vec = hidden_states[-3][:, crop_start:n_attended]; FramePack asserts that the mask
	// is all ones there (right padding).
	rows := max(0, nAttended-p.CropStart)
	for i := p.CropStart; i < nAttended; i++ {
		if !mask[i] {
			return Conds{}, fmt.Errorf("%w: llama attention mask is not a prefix of ones (position %d)", ErrInvalidArgument, i)
		}
	}
	c := Conds{Rows: rows, Tokens: toks}
	hidden := e.Llama.Config.HiddenSize
	c.LlamaVec = make([]float32, p.PadLength*hidden)
	c.LlamaMask = make([]bool, p.PadLength)
	if rows > 0 {
		h, err := e.Llama.HiddenState(ids, mask) // [1, ≥ n_attended, hidden]
		if err != nil {
			return Conds{}, fmt.Errorf("text_encoder: %w", err)
		}
		keep := min(rows, p.PadLength) // crop_or_pad_yield_mask: cut to PadLength or pad
		vec, err := e.rt.Slice(h, 1, p.CropStart, p.CropStart+keep)
		h.Free()
		if err != nil {
			return Conds{}, fmt.Errorf("text_encoder: crop: %w", err)
		}
		v, err := vec.Float32()
		vec.Free()
		if err != nil {
			return Conds{}, fmt.Errorf("text_encoder: %w", err)
		}
		copy(c.LlamaVec, v)
		for i := range keep {
			c.LlamaMask[i] = true
		}
	}
	// An empty crop (rows 0) gives a [1, 0, C] tensor in the reference: all zeros, mask false.
	clipIDs := make([]int32, len(toks.CLIPIDs))
	for i, v := range toks.CLIPIDs {
		clipIDs[i] = int32(v)
	}
	pooled, err := e.CLIP.Pooled(clipIDs)
	if err != nil {
		return Conds{}, fmt.Errorf("text_encoder_2: %w", err)
	}
	c.CLIPPooler, err = pooled.Float32()
	pooled.Free()
	if err != nil {
		return Conds{}, fmt.Errorf("text_encoder_2: %w", err)
	}
	return c, nil
}

// ZeroNegative returns the negative conditioning FramePack uses when cfg is 1:
// torch.zeros_like of the positive outputs, padded by crop_or_pad_yield_mask — so the mask is
// the positive's mask (its rows are zeros that count as present).
func ZeroNegative(pos Conds) Conds {
	return Conds{
		LlamaVec:   make([]float32, len(pos.LlamaVec)),
		LlamaMask:  append([]bool(nil), pos.LlamaMask...),
		Rows:       pos.Rows,
		CLIPPooler: make([]float32, len(pos.CLIPPooler)),
	}
}
