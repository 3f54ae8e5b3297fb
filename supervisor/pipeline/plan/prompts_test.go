package plan

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestParsePrompts(t *testing.T) {
	tests := []struct {
		name, in string
		want     []TimedPrompt
	}{
		{"plain", "a cat sits [smiling]", []TimedPrompt{{0, "a cat sits [smiling]"}}},
		{"studio", "[0s: a cat sits] [2.5s: the cat jumps]", []TimedPrompt{{0, "a cat sits"}, {2.5, "the cat jumps"}}},
		{"unsorted, spaces, newlines", "  [3s:c]\n[ 1.25s :  b ]\t[0s: a]", []TimedPrompt{{0, "a"}, {1.25, "b"}, {3, "c"}}},
		{"starts late", "[1s: x]", []TimedPrompt{{1, "x"}}},
		{"colon in the prompt", "[0s: a: b]", []TimedPrompt{{0, "a: b"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePrompts(tc.in)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("ParsePrompts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParsePromptsErrors(t *testing.T) {
	tests := []struct {
		in   string
		pos  int
		says string
	}{
		{"[0s: a] b", 9, "outside"},
		{"[0s: a] [2s: b", 9, "never closed"},
		{"[0s a]", 2, "no ':'"},
		{"[0: a]", 2, "must end in s"},
		{"[xs: a]", 2, "not a number"},
		{"[-1s: a]", 2, "not a number"},
		{"[1e3s: a]", 2, "not a number"},
		{"[NaNs: a]", 2, "not a number"},
		{"[0s: a] [ 2.5.1s: b]", 11, "not a number"},
		{"[0s: ]", 4, "no prompt"},
		{"[0s: a] [0.0s: b]", 10, "second entry"},
		{"[0s: a [1s: b]", 8, "inside an entry"},
		{"[0s: a][1s: b]x", 15, "outside"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			_, err := ParsePrompts(tc.in)
			var pe *PromptError
			if !errors.As(err, &pe) {
				t.Fatalf("ParsePrompts(%q) err %v, want a PromptError", tc.in, err)
			}
			if pe.Pos != tc.pos || !strings.Contains(pe.Error(), tc.says) || !strings.Contains(pe.Error(), fmt.Sprintf("position %d", tc.pos)) {
				t.Errorf("ParsePrompts(%q): %v (pos %d); want position %d saying %q", tc.in, err, pe.Pos, tc.pos, tc.says)
			}
		})
	}
}

// TestPromptAt maps sections to prompts by their time in the video, not their generation
// order: a 4-section job of window 9 (1.2 s a section).
func TestPromptAt(t *testing.T) {
	ps, err := ParsePrompts("[0s: sit] [2.5s: jump] [3.6s: land] [9s: sit]")
	if err != nil {
		t.Fatal(err)
	}
	texts, index := DistinctPrompts(ps)
	if !slices.Equal(texts, []string{"sit", "jump", "land"}) || !slices.Equal(index, []int{0, 1, 2, 0}) {
		t.Fatalf("distinct %v %v", texts, index)
	}
	var got []string
	for k := range 4 { // time positions 0..3 start at 0, 1.2, 2.4, 3.6 s
		got = append(got, ps[PromptAt(ps, SectionStart(k, 9))].Prompt)
	}
	if want := []string{"sit", "sit", "sit", "land"}; !slices.Equal(got, want) {
		t.Fatalf("prompts by time position %v, want %v", got, want)
	}
	if late, _ := ParsePrompts("[1s: x] [2s: y]"); late[PromptAt(late, 0)].Prompt != "x" {
		t.Errorf("before the first entry the first prompt applies")
	}
}
