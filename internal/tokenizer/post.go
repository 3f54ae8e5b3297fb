package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postProcess is what a post-processor adds around a single sequence: prefix ids, the sequence,
// suffix ids (tokenizers' TemplateProcessing and friends, single-sequence case).
type postProcess struct {
	prefix, suffix []int32
}

func (p postProcess) added() int { return len(p.prefix) + len(p.suffix) }

// wrap composes p around an inner post-process (tokenizers' Sequence: each processor wraps the
// result of the previous one).
func (p postProcess) wrap(inner postProcess) postProcess {
	return postProcess{
		prefix: append(append([]int32(nil), p.prefix...), inner.prefix...),
		suffix: append(append([]int32(nil), inner.suffix...), p.suffix...),
	}
}

type postJSON struct {
	Type       string            `json:"type"`
	Processors []json.RawMessage `json:"processors"`
	Single     []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		ID  string  `json:"id"`
		IDs []int32 `json:"ids"`
	} `json:"special_tokens"`
	Sep *tokenAndID `json:"sep"`
	Cls *tokenAndID `json:"cls"`
}

// tokenAndID is a ["token", id] pair.
type tokenAndID struct {
	Token string
	ID    int32
}

func (t *tokenAndID) UnmarshalJSON(b []byte) error {
	var pair [2]json.RawMessage
	if err := json.Unmarshal(b, &pair); err != nil {
		return err
	}
	if err := json.Unmarshal(pair[0], &t.Token); err != nil {
		return err
	}
	return json.Unmarshal(pair[1], &t.ID)
}

// parsePostProcessor reads a "post_processor" section; null adds nothing.
func parsePostProcessor(raw json.RawMessage) (postProcess, error) {
	if isNull(raw) {
		return postProcess{}, nil
	}
	p, err := parsePostItem(raw)
	if err != nil {
		return postProcess{}, fmt.Errorf("post_processor: %w", err)
	}
	return p, nil
}

func parsePostItem(raw json.RawMessage) (postProcess, error) {
	var j postJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return postProcess{}, err
	}
	switch j.Type {
	case "ByteLevel": // offsets only
		return postProcess{}, nil
	case "Sequence":
		var out postProcess
		for _, sub := range j.Processors {
			p, err := parsePostItem(sub)
			if err != nil {
				return postProcess{}, err
			}
			out = p.wrap(out)
		}
		return out, nil
	case "RobertaProcessing", "BertProcessing":
		if j.Cls == nil || j.Sep == nil {
			return postProcess{}, fmt.Errorf("%s: cls and sep are required", j.Type)
		}
		return postProcess{prefix: []int32{j.Cls.ID}, suffix: []int32{j.Sep.ID}}, nil
	case "TemplateProcessing":
		var out postProcess
		seen := false
		for _, piece := range j.Single {
			switch {
			case piece.Sequence != nil:
				if piece.Sequence.ID != "A" || seen {
					return postProcess{}, fmt.Errorf("template: single template has sequence %q", piece.Sequence.ID)
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := j.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return postProcess{}, fmt.Errorf("template: special token %q is not defined", piece.SpecialToken.ID)
				}
				if seen {
					out.suffix = append(out.suffix, st.IDs...)
				} else {
					out.prefix = append(out.prefix, st.IDs...)
				}
			default:
				return postProcess{}, fmt.Errorf("template: piece is neither Sequence nor SpecialToken")
			}
		}
		if !seen {
			return postProcess{}, fmt.Errorf("template: single template has no $A")
		}
		return out, nil
	}
	return postProcess{}, unsupported("post-processor", j.Type)
}
