package causalvae_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/workers/vae/causalvae"
)

// TestCorruptHeaderMessage: weights whose header does not parse are reported as a bad
// checkpoint with the parser's reason, not as a checkpoint that "does not match the model
// config" (which sends a user hunting for a config mistake).
func TestCorruptHeaderMessage(t *testing.T) {
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg, err := os.ReadFile(filepath.Join(root, "models", "hunyuanvideo", "vae", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := append([]byte{200, 0, 0, 0, 0, 0, 0, 0}, []byte("{not json at all")...)
	if err := os.WriteFile(filepath.Join(dir, "diffusion_pytorch_model.safetensors"), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = causalvae.Load(nil, dir, causalvae.Options{})
	if err == nil || !errors.Is(err, causalvae.ErrCheckpoint) {
		t.Fatalf("load of a corrupt header: %v", err)
	}
	if strings.Contains(err.Error(), "does not match") || !strings.Contains(err.Error(), "bad checkpoint") {
		t.Fatalf("message %q", err)
	}
}
