package plan

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// TimedPrompt is one prompt of a timed prompt and the video time it starts at.
type TimedPrompt struct {
	// Start is the time in seconds from which the prompt applies.
	Start float64
	// Prompt is the prompt's text, trimmed.
	Prompt string
}

// PromptError is a malformed timed prompt: what is wrong and where.
type PromptError struct {
	// Pos is the 1-based byte position in the prompt where the problem is.
	Pos int
	// Msg says what is wrong.
	Msg string
}

// Error says what is wrong at which position.
func (e *PromptError) Error() string {
	return fmt.Sprintf("timed prompt: position %d: %s (the syntax is [0s: a cat sits] [2.5s: the cat jumps])", e.Pos, e.Msg)
}

// IsTimed reports whether a prompt uses FramePack-Studio's timed syntax: it starts, after
// spaces, with '['.
func IsTimed(prompt string) bool {
	return strings.HasPrefix(strings.TrimLeftFunc(prompt, unicode.IsSpace), "[")
}

// ParsePrompts reads a prompt. A plain prompt is one TimedPrompt at 0 s, unchanged. A timed prompt, in
// FramePack-Studio's syntax `[0s: a cat sits] [2.5s: the cat jumps]`, is a sequence of
// bracketed entries separated by spaces, each a time in seconds with an "s", a colon and a
// non-empty prompt; they are returned sorted by time. Anything else (text outside brackets,
// a time that is not a finite number ≥ 0, a missing "s" or colon, an unclosed bracket, two
// entries at one time) is a *PromptError with the position.
func ParsePrompts(prompt string) ([]TimedPrompt, error) {
	if !IsTimed(prompt) {
		return []TimedPrompt{{Start: 0, Prompt: prompt}}, nil // as typed: encoded as before
	}
	var out []TimedPrompt
	at := map[float64]int{}
	i := 0
	for {
		for i < len(prompt) && isSpace(prompt[i]) {
			i++
		}
		if i == len(prompt) {
			break
		}
		if prompt[i] != '[' {
			return nil, &PromptError{Pos: i + 1, Msg: fmt.Sprintf("text %q outside [time: prompt] entries", excerpt(prompt[i:]))}
		}
		open := i
		end := strings.IndexByte(prompt[i:], ']')
		if end < 0 {
			return nil, &PromptError{Pos: open + 1, Msg: "'[' is never closed with ']'"}
		}
		end += i
		if nested := strings.IndexByte(prompt[i+1:end], '['); nested >= 0 {
			return nil, &PromptError{Pos: i + 2 + nested, Msg: "'[' inside an entry (the one at position " + strconv.Itoa(open+1) + " is not closed)"}
		}
		body := prompt[i+1 : end]
		colon := strings.IndexByte(body, ':')
		if colon < 0 {
			return nil, &PromptError{Pos: open + 2, Msg: fmt.Sprintf("entry %q has no ':' after its time", excerpt(body))}
		}
		ts := strings.TrimSpace(body[:colon])
		tsPos := open + 2 + (len(body[:colon]) - len(strings.TrimLeftFunc(body[:colon], unicode.IsSpace)))
		num, ok := strings.CutSuffix(ts, "s")
		if !ok {
			return nil, &PromptError{Pos: tsPos, Msg: fmt.Sprintf("time %q must end in s (seconds)", ts)}
		}
		t, err := strconv.ParseFloat(num, 64)
		if err != nil || num == "" || strings.ContainsAny(num, "+-eExXpP_") || math.IsNaN(t) || math.IsInf(t, 0) {
			return nil, &PromptError{Pos: tsPos, Msg: fmt.Sprintf("time %q is not a number of seconds ≥ 0", ts)}
		}
		text := strings.TrimSpace(body[colon+1:])
		if text == "" {
			return nil, &PromptError{Pos: open + 2 + colon, Msg: fmt.Sprintf("the entry at %ss has no prompt", num)}
		}
		if prev, dup := at[t]; dup {
			return nil, &PromptError{Pos: tsPos, Msg: fmt.Sprintf("a second entry at %gs (the first is at position %d)", t, prev)}
		}
		at[t] = tsPos
		out = append(out, TimedPrompt{Start: t, Prompt: text})
		i = end + 1
	}
	if len(out) == 0 {
		return nil, &PromptError{Pos: 1, Msg: "no entries"}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Start < out[b].Start })
	return out, nil
}

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

func excerpt(s string) string {
	if len(s) > 24 {
		return s[:24] + "…"
	}
	return s
}

// SectionStart is the video time in seconds at which the section at time position k (0 is
// the first section of the video, whatever order the sections are generated in) starts, with
// a window of w latent frames: each section adds 4·w frames at 30 fps after the start frame.
func SectionStart(k, w int) float64 { return float64(k*4*w) / 30 }

// PromptAt returns the index in ps (sorted by Start) of the prompt active at time t: the last
// that starts at or before t, or the first when t is before them all (as FramePack-Studio
// falls back to the first prompt).
func PromptAt(ps []TimedPrompt, t float64) int {
	k := 0
	for i, p := range ps {
		if p.Start <= t+1e-9 {
			k = i
		}
	}
	return k
}

// DistinctPrompts lists the distinct prompt texts of ps in order of first appearance, and for
// each entry of ps the index of its text in that list, so each text is encoded once.
func DistinctPrompts(ps []TimedPrompt) (texts []string, index []int) {
	seen := map[string]int{}
	for _, p := range ps {
		k, ok := seen[p.Prompt]
		if !ok {
			k = len(texts)
			seen[p.Prompt] = k
			texts = append(texts, p.Prompt)
		}
		index = append(index, k)
	}
	return texts, index
}
