// Package torchrng reproduces PyTorch's CPU random number generator bit for bit: the mt19937
// engine seeded as torch.Generator("cpu").manual_seed(seed) seeds it, and torch.randn for float32
// CPU tensors, so a job seeded here draws the same noise as the reference app with the same seed.
//
// A Generator's whole state (engine words, position and the cached Box-Muller sample) marshals to
// bytes and back, so one job's generator can be carried from section to section, across worker
// processes and supervisor restarts, exactly as FramePack consumes one generator per job.
//
// What it follows (PyTorch 2.x, aten/src/ATen):
//   - core/MT19937RNGEngine.h: Matsumoto–Nishimura mt19937 with the 2002 initialisation from the
//     low 32 bits of the seed; the engine twists lazily on the first draw.
//   - CPUGeneratorImpl.cpp: random64() is two draws, the first one the high word.
//   - native/cpu/DistributionTemplates.h normal_kernel: a contiguous float32 tensor of 16 or more
//     elements is filled with 24-bit uniforms and transformed in blocks of 16 by a vectorised
//     Box-Muller (normal_fill_16_AVX2, with avx_mathfun.h's log and sincos polynomials; the
//     AVX-512 build dispatches normal to the AVX2 kernel too); a size that is not a multiple of 16
//     draws 16 fresh uniforms for the last 16 elements and transforms them again. Fewer than 16
//     elements take the scalar path: at::normal_distribution<double> per element (53-bit
//     uniforms, log1p, the sine cached in the generator for the next element).
package torchrng

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

const (
	stateN = 624 // mt19937 state words
	stateM = 397

	matrixA   = 0x9908b0df
	upperMask = 0x80000000
	lowerMask = 0x7fffffff
)

// ErrInvalidState is returned (wrapped) when serialised generator state cannot be restored.
var ErrInvalidState = errors.New("invalid torchrng state")

// Generator is a PyTorch-compatible CPU generator. It is not safe for concurrent use.
type Generator struct {
	seed  uint64
	state [stateN]uint32
	left  uint32 // draws until the next twist, plus one (the engine's left_)
	next  uint32 // index of the next state word to temper (the engine's next_)

	// The second Box-Muller value of at::normal_distribution<double>, kept for the next draw
	// (CPUGeneratorImpl's next_double_normal_sample).
	normalValid bool
	normal      float64
}

// New returns a generator seeded as torch.Generator("cpu").manual_seed(seed) does.
func New(seed uint64) *Generator {
	g := &Generator{}
	g.Reseed(seed)
	return g
}

// SeedFromInt maps a Python-side seed to the uint64 PyTorch uses: manual_seed remaps a negative
// seed s to 0xffff_ffff_ffff_ffff + s.
func SeedFromInt(seed int64) uint64 {
	if seed < 0 {
		return math.MaxUint64 + uint64(seed)
	}
	return uint64(seed)
}

// Reseed resets the generator to the state manual_seed(seed) gives, dropping any cached normal.
func (g *Generator) Reseed(seed uint64) {
	g.seed = seed
	g.state[0] = uint32(seed)
	for j := 1; j < stateN; j++ {
		prev := g.state[j-1]
		g.state[j] = 1812433253*(prev^(prev>>30)) + uint32(j)
	}
	g.left = 1
	g.next = 0
	g.normalValid = false
	g.normal = 0
}

// InitialSeed returns the seed the generator was last seeded with (torch's initial_seed()).
func (g *Generator) InitialSeed() uint64 { return g.seed }

func twist(u, v uint32) uint32 {
	y := ((u & upperMask) | (v & lowerMask)) >> 1
	if v&1 != 0 {
		y ^= matrixA
	}
	return y
}

func (g *Generator) nextState() {
	s := &g.state
	i := 0
	for ; i < stateN-stateM; i++ {
		s[i] = s[i+stateM] ^ twist(s[i], s[i+1])
	}
	for ; i < stateN-1; i++ {
		s[i] = s[i+stateM-stateN] ^ twist(s[i], s[i+1])
	}
	s[stateN-1] = s[stateM-1] ^ twist(s[stateN-1], s[0])
	g.left = stateN
	g.next = 0
}

// Uint32 returns the next 32-bit draw (torch's generator->random()).
func (g *Generator) Uint32() uint32 {
	g.left--
	if g.left == 0 {
		g.nextState()
	}
	y := g.state[g.next]
	g.next++
	y ^= y >> 11
	y ^= (y << 7) & 0x9d2c5680
	y ^= (y << 15) & 0xefc60000
	y ^= y >> 18
	return y
}

// Uint64 returns two draws as one 64-bit value, the first as the high word (random64()).
func (g *Generator) Uint64() uint64 {
	hi := g.Uint32()
	lo := g.Uint32()
	return uint64(hi)<<32 | uint64(lo)
}

// uniformFloat32 is at::uniform_real_distribution<float>(0, 1): 24 bits scaled by 2^-24.
func (g *Generator) uniformFloat32() float32 {
	return float32(g.Uint32()&(1<<24-1)) * (1.0 / (1 << 24))
}

// uniformFloat64 is at::uniform_real_distribution<double>(0, 1): 53 bits scaled by 2^-53.
func (g *Generator) uniformFloat64() float64 {
	return float64(g.Uint64()&(1<<53-1)) * (1.0 / (1 << 53))
}

// normalFloat64 is one at::normal_distribution<double>(0, 1) draw, with the generator's cache.
func (g *Generator) normalFloat64() float64 {
	if g.normalValid {
		g.normalValid = false
		return g.normal
	}
	u1 := g.uniformFloat64()
	u2 := g.uniformFloat64()
	r := math.Sqrt(float64(-2.0 * math.Log1p(-u2)))
	theta := float64(2.0*math.Pi) * u1
	g.normal = float64(r * math.Sin(theta))
	g.normalValid = true
	return float64(r * math.Cos(theta))
}

// stateMagic starts every marshalled state; the byte after it is the format version.
var stateMagic = [4]byte{'T', 'R', 'N', 'G'}

const (
	stateVersion = 1
	// StateSize is the length of MarshalBinary's output.
	StateSize = 4 + 1 + 8 + 4 + 4 + 4*stateN + 1 + 8
)

// MarshalBinary returns the generator's complete state: magic "TRNG", version, seed, the
// engine's left and next counters, the 624 state words and the cached normal (flag, float64
// bits), all little-endian. It never fails.
func (g *Generator) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, StateSize)
	b = append(b, stateMagic[:]...)
	b = append(b, stateVersion)
	b = binary.LittleEndian.AppendUint64(b, g.seed)
	b = binary.LittleEndian.AppendUint32(b, g.left)
	b = binary.LittleEndian.AppendUint32(b, g.next)
	for _, w := range g.state {
		b = binary.LittleEndian.AppendUint32(b, w)
	}
	if g.normalValid {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(g.normal))
	return b, nil
}

// UnmarshalBinary restores a state written by MarshalBinary. On error the generator is unchanged.
func (g *Generator) UnmarshalBinary(b []byte) error {
	if len(b) != StateSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrInvalidState, len(b), StateSize)
	}
	if [4]byte(b[:4]) != stateMagic {
		return fmt.Errorf("%w: bad magic %q", ErrInvalidState, b[:4])
	}
	if b[4] != stateVersion {
		return fmt.Errorf("%w: version %d, want %d", ErrInvalidState, b[4], stateVersion)
	}
	le := binary.LittleEndian
	var n Generator
	n.seed = le.Uint64(b[5:])
	n.left = le.Uint32(b[13:])
	n.next = le.Uint32(b[17:])
	off := 21
	for i := range n.state {
		n.state[i] = le.Uint32(b[off:])
		off += 4
	}
	switch b[off] {
	case 0:
	case 1:
		n.normalValid = true
	default:
		return fmt.Errorf("%w: normal flag %d", ErrInvalidState, b[off])
	}
	n.normal = math.Float64frombits(le.Uint64(b[off+1:]))
	// Every draw decrements left and, unless it twisted, reads state[next] and increments next;
	// left+next never exceeds stateN+1, which also keeps every read in bounds.
	if n.left < 1 || n.left > stateN || n.next > stateN || n.left+n.next > stateN+1 {
		return fmt.Errorf("%w: left %d, next %d", ErrInvalidState, n.left, n.next)
	}
	if !n.normalValid && n.normal != 0 {
		return fmt.Errorf("%w: cached normal without its flag", ErrInvalidState)
	}
	*g = n
	return nil
}

// Clone returns an independent copy of the generator.
func (g *Generator) Clone() *Generator {
	c := *g
	return &c
}
