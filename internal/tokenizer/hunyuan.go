package tokenizer

import (
	"fmt"
	"strings"
)

// HunyuanTemplate is diffusers' DEFAULT_PROMPT_TEMPLATE["template"] for HunyuanVideo, which
// FramePack's encode_prompt_conds formats the prompt into (Python str.format, one "{}").
const HunyuanTemplate = "<|start_header_id|>system<|end_header_id|>\n\n" +
	"Describe the video by detailing the following aspects: " +
	"1. The main content and theme of the video." +
	"2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects." +
	"3. Actions, events, behaviors temporal relationships, physical movement changes of the objects." +
	"4. background environment, light, style and atmosphere." +
	"5. camera angles, movements, and transitions used in the video:<|eot_id|>" +
	"<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"

// HunyuanCropStart is DEFAULT_PROMPT_TEMPLATE["crop_start"]: the template's ids before the prompt
// (BOS included), which the text encoder drops from its output.
const HunyuanCropStart = 95

// PromptConfig holds the parameters of FramePack's encode_prompt_conds tokenisation.
type PromptConfig struct {
	// LlamaTemplate is the str.format template the prompt goes into for the Llama tokenizer.
	LlamaTemplate string
	// LlamaMaxLength is max_length for the Llama ids (256 + crop_start in FramePack): the ids are
	// truncated and padded to it.
	LlamaMaxLength int
	// CLIPMaxLength is max_length for the CLIP ids (77).
	CLIPMaxLength int
}

// DefaultPromptConfig returns FramePack's settings: HunyuanTemplate, 256+95 and 77.
func DefaultPromptConfig() PromptConfig {
	return PromptConfig{LlamaTemplate: HunyuanTemplate, LlamaMaxLength: 256 + HunyuanCropStart, CLIPMaxLength: 77}
}

// PromptTokens are a prompt's ids for both text encoders.
type PromptTokens struct {
	// LlamaIDs and LlamaMask have LlamaMaxLength entries each.
	LlamaIDs, LlamaMask []int64
	// CLIPIDs has CLIPMaxLength entries (CLIP's text model takes no mask in FramePack).
	CLIPIDs []int64
}

// PromptTokenizer is HunyuanVideo's pair of tokenizers.
type PromptTokenizer struct {
	// Llama is the tokenizer/ folder's tokenizer (Llama 3, BOS template).
	Llama *Tokenizer
	// CLIP is the tokenizer_2/ folder's tokenizer (CLIP-L).
	CLIP *Tokenizer
}

// LoadPromptTokenizer loads the Llama tokenizer from llamaDir (HunyuanVideo's tokenizer/) and the
// CLIP tokenizer from clipDir (tokenizer_2/).
func LoadPromptTokenizer(llamaDir, clipDir string) (*PromptTokenizer, error) {
	llama, err := LoadDir(llamaDir)
	if err != nil {
		return nil, err
	}
	clip, err := LoadDir(clipDir)
	if err != nil {
		return nil, err
	}
	return &PromptTokenizer{Llama: llama, CLIP: clip}, nil
}

// Encode tokenises a prompt as FramePack's encode_prompt_conds does: the formatted template with
// the Llama tokenizer (BOS, truncation and padding to LlamaMaxLength, attention mask), the bare
// prompt with CLIP (start and end tokens, truncation and padding to CLIPMaxLength with the pad
// token). A prompt that is not valid UTF-8 gives an error wrapping ErrInvalidPrompt.
func (p *PromptTokenizer) Encode(prompt string, cfg PromptConfig) (PromptTokens, error) {
	if err := checkUTF8(prompt); err != nil {
		return PromptTokens{}, err
	}
	if cfg.LlamaMaxLength <= 0 || cfg.CLIPMaxLength <= 0 {
		return PromptTokens{}, fmt.Errorf("encode prompt: max lengths must be positive (llama %d, clip %d)", cfg.LlamaMaxLength, cfg.CLIPMaxLength)
	}
	text, err := FormatTemplate(cfg.LlamaTemplate, prompt)
	if err != nil {
		return PromptTokens{}, fmt.Errorf("encode prompt: %w", err)
	}
	llama, err := p.Llama.Encode(text, Options{Truncate: true, Pad: true, MaxLength: cfg.LlamaMaxLength})
	if err != nil {
		return PromptTokens{}, fmt.Errorf("encode prompt: llama: %w", err)
	}
	clip, err := p.CLIP.Encode(prompt, Options{Truncate: true, Pad: true, MaxLength: cfg.CLIPMaxLength})
	if err != nil {
		return PromptTokens{}, fmt.Errorf("encode prompt: clip: %w", err)
	}
	return PromptTokens{LlamaIDs: llama.IDs, LlamaMask: llama.Mask, CLIPIDs: clip.IDs}, nil
}

// TemplatePrefixLength returns the number of Llama ids (special tokens included) that come before
// the prompt in template, which is crop_start for a template whose prompt starts a new piece.
func (p *PromptTokenizer) TemplatePrefixLength(template string) (int, error) {
	i := strings.Index(template, "{}")
	if i < 0 {
		return 0, fmt.Errorf("template has no {}")
	}
	prefix, err := FormatTemplate(template[:i], "")
	if err != nil {
		return 0, err
	}
	enc, err := p.Llama.Encode(prefix, Options{})
	if err != nil {
		return 0, err
	}
	return len(enc.IDs), nil
}

// FormatTemplate is Python's template.format(arg) for templates with positional fields: "{}" and
// "{0}" become arg, "{{" and "}}" become braces; anything else in braces is an error. arg itself is
// inserted as it is.
func FormatTemplate(template, arg string) (string, error) {
	var b strings.Builder
	b.Grow(len(template) + len(arg))
	for i := 0; i < len(template); i++ {
		c := template[i]
		switch {
		case c == '{' && i+1 < len(template) && template[i+1] == '{':
			b.WriteByte('{')
			i++
		case c == '}' && i+1 < len(template) && template[i+1] == '}':
			b.WriteByte('}')
			i++
		case c == '{':
			end := strings.IndexByte(template[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("template: single '{' at byte %d", i)
			}
			field := template[i+1 : i+end]
			if field != "" && field != "0" {
				return "", fmt.Errorf("template: field {%s} at byte %d (only {} or {0})", field, i)
			}
			b.WriteString(arg)
			i += end
		case c == '}':
			return "", fmt.Errorf("template: single '}' at byte %d", i)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}
