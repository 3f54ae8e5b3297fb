package imageproc

import (
	"bytes"
	"path/filepath"
	"strings"
)

// Format is an input image container.
type Format string

// The formats Decode reads.
const (
	FormatPNG  Format = "png"
	FormatJPEG Format = "jpeg"
	FormatWebP Format = "webp"
)

// Sniff returns the format of data from its signature, or "" when it is none of ours.
func Sniff(data []byte) Format {
	switch {
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		return FormatPNG
	case bytes.HasPrefix(data, []byte{0xff, 0xd8, 0xff}):
		return FormatJPEG
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP":
		return FormatWebP
	}
	return ""
}

// FormatFromName guesses a format from a file name's extension ("" when it names none of ours), for
// callers that want Options.Declared checked.
func FormatFromName(name string) Format {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".png":
		return FormatPNG
	case ".jpg", ".jpeg", ".jpe", ".jfif":
		return FormatJPEG
	case ".webp":
		return FormatWebP
	}
	return ""
}
