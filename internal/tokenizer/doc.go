// Package tokenizer turns prompts into token ids the way the reference pipeline does: Hugging Face
// `tokenizers` (as driven by transformers 5) for byte-level BPE tokenizers stored as tokenizer.json
// (Meta's Llama 3 file in HunyuanVideo's tokenizer/ folder), and transformers' CLIPTokenizer for a
// vocab.json + merges.txt pair (HunyuanVideo's tokenizer_2/ folder).
//
// What is implemented, component by component (anything else is refused at load with its name,
// wrapped in ErrUnsupported):
//
//   - model: BPE (rank map + heap merge, per-word cache, unk_token/fuse_unk, byte_fallback,
//     continuing_subword_prefix, end_of_word_suffix, ignore_merges); dropout must be null or 0.
//   - normalizers: NFC, NFD, NFKC, NFKD, Lowercase, Replace (string or regex), Strip, Prepend,
//     Sequence.
//   - pre-tokenizers: Split (string or regex pattern, all five delimiter behaviours, invert),
//     ByteLevel (add_prefix_space, use_regex; must come last), Sequence. The Llama 3, GPT-2 and CLIP
//     split patterns are matched by hand-written scanners that follow the regex semantics exactly
//     (linear time, no regex engine); any other pattern runs on github.com/dlclark/regexp2, a
//     backtracking engine with look-around.
//   - post-processors: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence
//     (single sequences).
//   - added tokens: matched leftmost-longest on the raw text (normalized=false) and then on the
//     normalized text (normalized=true), with lstrip, rstrip and single_word, before anything else.
//   - truncation and padding: right or left, to a caller's max_length (as transformers' call
//     arguments truncation=True, padding="max_length") or to model_max_length.
//
// Input rules: a prompt must be valid UTF-8, otherwise Encode fails with an error that wraps
// ErrInvalidPrompt (a Python str cannot hold invalid UTF-8, so the reference has no answer to copy).
// A NUL byte is valid UTF-8 and is tokenised as the reference does (byte-level BPE has a token for
// every byte). Special-token text inside a prompt (for example "<|eot_id|>") becomes that special
// token, as in the reference (split_special_tokens=False). Very long prompts are fine: right-side
// truncation stops tokenising once max_length ids are certain, which gives the same ids as
// tokenising everything and cutting (pre-tokenised words never depend on text after them), and
// every stage is linear or n·log n in the prompt length.
//
// Known limits of exactness: Unicode tables are Go's (Unicode 15.0) where the reference uses those
// of Oniguruma and Rust's unicode-normalization-alignments; characters whose properties changed
// between those versions may split differently. Decode is tokenizers' decode (no transformers
// clean_up_tokenization_spaces).
//
// A Tokenizer is safe for concurrent use.
package tokenizer
