package latentpreview

import (
	"errors"
	"testing"
)

func TestDecodeFake(t *testing.T) {
	// One latent pixel with channel 10 = 1: rgb = row 10 + bias, clamped.
	lat := make([]float32, Channels)
	lat[10] = 1
	got, err := DecodeFake([5]int{1, Channels, 1, 1, 1}, lat)
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{0.1166 + 0.0259, 0.1627 - 0.0192, 0.0962 - 0.0761}
	for i := range want {
		if d := got[i] - want[i]; d > 1e-6 || d < -1e-6 {
			t.Fatalf("rgb %v, want %v", got, want)
		}
	}
	// Zero latents give the clamped bias (blue is negative → 0).
	if got, _ = DecodeFake([5]int{1, Channels, 1, 1, 1}, make([]float32, Channels)); got[2] != 0 || got[0] != 0.0259 {
		t.Fatalf("zero latents → %v", got)
	}
	for _, bad := range []struct {
		shape [5]int
		n     int
	}{{[5]int{1, 4, 1, 2, 2}, 16}, {[5]int{1, Channels, 1, 2, 2}, 3}} {
		if _, err := DecodeFake(bad.shape, make([]float32, bad.n)); !errors.Is(err, ErrBadInput) {
			t.Errorf("shape %v with %d values: %v", bad.shape, bad.n, err)
		}
	}
}
