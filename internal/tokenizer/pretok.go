package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
)

// preTokenizer splits a piece of normalized text into smaller pieces. Pieces are produced in order
// through emit, so that a caller that has seen enough can stop (emit returns false; split then
// returns false). Empty pieces are never emitted.
type preTokenizer interface {
	split(s string, emit func(piece string) bool) bool
}

// Split delimiter behaviours (tokenizers' SplitDelimiterBehavior).
type behavior int

const (
	behaviorRemoved behavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

var behaviorNames = map[string]behavior{
	"Removed":            behaviorRemoved,
	"Isolated":           behaviorIsolated,
	"MergedWithPrevious": behaviorMergedWithPrevious,
	"MergedWithNext":     behaviorMergedWithNext,
	"Contiguous":         behaviorContiguous,
}

// splitPre is tokenizers' Split pre-tokenizer: the pattern's matches and the gaps between them
// become pieces according to the behaviour (with invert, matches and gaps swap roles).
type splitPre struct {
	f        finder
	behavior behavior
	invert   bool
}

func (p *splitPre) split(s string, emit func(string) bool) bool {
	if s == "" {
		return true
	}
	// pending is the last piece built, not yet emitted (behaviours may still extend it).
	pendStart, pendEnd, havePending := 0, 0, false
	prevMatch := false
	flush := func() bool {
		if havePending {
			havePending = false
			if pendEnd > pendStart {
				return emit(s[pendStart:pendEnd])
			}
		}
		return true
	}
	push := func(start, end int) bool {
		if !flush() {
			return false
		}
		pendStart, pendEnd, havePending = start, end, true
		return true
	}
	span := func(start, end int, isMatch bool) bool {
		if p.invert {
			isMatch = !isMatch
		}
		ok := true
		switch p.behavior {
		case behaviorIsolated:
			ok = push(start, end)
		case behaviorRemoved:
			if !isMatch {
				ok = push(start, end)
			}
		case behaviorContiguous:
			if isMatch == prevMatch && havePending {
				pendEnd = end
			} else {
				ok = push(start, end)
			}
		case behaviorMergedWithPrevious:
			if isMatch && !prevMatch && havePending {
				pendEnd = end
			} else {
				ok = push(start, end)
			}
		case behaviorMergedWithNext:
			// A delimiter joins the span after it unless that span is a delimiter too.
			if prevMatch && havePending && !isMatch {
				pendEnd = end
			} else {
				ok = push(start, end)
			}
		}
		prevMatch = isMatch
		return ok
	}
	prev := 0
	if !p.f.matches(s, func(start, end int) bool {
		if start > prev && !span(prev, start, false) {
			return false
		}
		prev = end
		return span(start, end, true)
	}) {
		return false
	}
	if prev < len(s) && !span(prev, len(s), false) {
		return false
	}
	return flush()
}

// byteLevelPre is tokenizers' ByteLevel pre-tokenizer. The byte-to-alphabet mapping itself is
// done by the BPE model (it sees raw bytes); here only add_prefix_space and the GPT-2 split.
type byteLevelPre struct {
	addPrefixSpace bool
	useRegex       bool
}

func (p *byteLevelPre) split(s string, emit func(string) bool) bool {
	if s == "" {
		return true
	}
	if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if !p.useRegex {
		return emit(s)
	}
	return gpt2Finder{}.matches(s, func(start, end int) bool { return emit(s[start:end]) })
}

// parsedPre is the pre-tokenizer chain of a tokenizer file, flattened.
type parsedPre struct {
	steps     []preTokenizer
	byteLevel bool // a ByteLevel pre-tokenizer ends the chain
}

type preJSON struct {
	Type           string            `json:"type"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        *patternJSON      `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func (p *patternJSON) finder() (finder, error) {
	switch {
	case p == nil:
		return nil, fmt.Errorf("split: no pattern")
	case p.String != nil:
		return literalFinder{lit: *p.String}, nil
	case p.Regex != nil:
		f, err := finderFor(*p.Regex)
		if err != nil {
			return nil, fmt.Errorf("%w: regex %q: %v", ErrUnsupported, *p.Regex, err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("split: pattern is neither String nor Regex")
}

// parsePreTokenizer reads a "pre_tokenizer" section (null gives an empty chain).
func parsePreTokenizer(raw json.RawMessage) (parsedPre, error) {
	var out parsedPre
	if isNull(raw) {
		return out, nil
	}
	if err := out.add(raw); err != nil {
		return parsedPre{}, fmt.Errorf("pre_tokenizer: %w", err)
	}
	return out, nil
}

func (out *parsedPre) add(raw json.RawMessage) error {
	var p preJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return err
	}
	if out.byteLevel {
		return fmt.Errorf("%w: pre-tokenizer %q after ByteLevel (ByteLevel must come last)", ErrUnsupported, p.Type)
	}
	switch p.Type {
	case "Sequence":
		for _, sub := range p.PreTokenizers {
			if err := out.add(sub); err != nil {
				return err
			}
		}
	case "Split":
		f, err := p.Pattern.finder()
		if err != nil {
			return err
		}
		b, ok := behaviorNames[p.Behavior]
		if !ok {
			return unsupported("split behavior", p.Behavior)
		}
		out.steps = append(out.steps, &splitPre{f: f, behavior: b, invert: p.Invert})
	case "ByteLevel":
		useRegex := true
		if p.UseRegex != nil {
			useRegex = *p.UseRegex
		}
		out.steps = append(out.steps, &byteLevelPre{addPrefixSpace: p.AddPrefixSpace, useRegex: useRegex})
		out.byteLevel = true
	default:
		return unsupported("pre-tokenizer", p.Type)
	}
	return nil
}

// run applies the chain to s from step i on.
func (pp *parsedPre) run(i int, s string, emit func(string) bool) bool {
	if s == "" {
		return true
	}
	if i == len(pp.steps) {
		return emit(s)
	}
	return pp.steps[i].split(s, func(piece string) bool { return pp.run(i+1, piece, emit) })
}

func isNull(raw json.RawMessage) bool {
	t := strings.TrimSpace(string(raw))
	return t == "" || t == "null"
}
