package watchdog

import (
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestHangChangeText: the retry note of a hang says where it was in the user's terms: a hang
// in a conv3d at the last tier (cpu) names the convolution and never says "not in a
// convolution"; a hang in another op names the op.
func TestHangChangeText(t *testing.T) {
	l := DefaultLadder(0)
	st := StageInfo{Kind: framepackv1.Stage_STAGE_VAE_DECODE, Traits: vaeTraits}
	for _, tc := range []struct {
		name    string
		b       beacon.Snapshot
		want    string
		notWant string
	}{
		{"conv3d at the cpu tier", beacon.Snapshot{InOp: true, Op: "conv3d", ConvKey: "K", ConvTier: LastConvTier},
			`convolution "K" at tier ` + LastConvTier, "not in a convolution"},
		{"conv op without a tier", beacon.Snapshot{InOp: true, Op: "conv3d"}, "op conv3d", "not in a convolution"},
		{"gemm", beacon.Snapshot{InOp: true, Op: "gemm"}, "op gemm, not in a convolution", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step, ok := l.Next(st, ClassHang, 1, workerkit.Override{}, &Verdict{Kind: VerdictOpOverdue, Beacon: tc.b})
			if !ok || !strings.Contains(step.Change, tc.want) || (tc.notWant != "" && strings.Contains(step.Change, tc.notWant)) {
				t.Fatalf("change %q, want %q without %q", step.Change, tc.want, tc.notWant)
			}
		})
	}
}
