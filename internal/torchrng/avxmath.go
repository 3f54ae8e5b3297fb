package torchrng

import "math"

// One lane of avx_mathfun.h (Cephes-derived log and sincos for 8 floats, as PyTorch's AVX2
// normal kernel uses them), operation by operation in float32.
//
// PyTorch's x86 builds compile that header with GCC and -mfma, and GCC contracts a multiply
// whose only use is an add or subtract into one fused multiply-add (when both operands of the
// add are products, the earlier multiply is fused and the later one rounded on its own). The
// fused form reproduces the reference bit for bit on every rng fixture case; evaluating each
// product separately differs in about 1% of the values by one ulp. So every such pair below is
// fma32, and every other product is wrapped in float32() so the Go compiler cannot fuse it.

// toF32 rounds a float64 to float32 at run time, as a C float initialised from a double literal.
func toF32(x float64) float32 { return float32(x) }

var (
	cephesSQRTHF = toF32(0.707106781186547524)
	logP0        = toF32(7.0376836292e-2)
	logP1        = toF32(-1.1514610310e-1)
	logP2        = toF32(1.1676998740e-1)
	logP3        = toF32(-1.2420140846e-1)
	logP4        = toF32(+1.4249322787e-1)
	logP5        = toF32(-1.6668057665e-1)
	logP6        = toF32(+2.0000714765e-1)
	logP7        = toF32(-2.4999993993e-1)
	logP8        = toF32(+3.3333331174e-1)
	logQ1        = toF32(-2.12194440e-4)
	logQ2        = toF32(0.693359375)

	minusDP1 = toF32(-0.78515625)
	minusDP2 = toF32(-2.4187564849853515625e-4)
	minusDP3 = toF32(-3.77489497744594108e-8)
	sinP0    = toF32(-1.9515295891e-4)
	sinP1    = toF32(8.3321608736e-3)
	sinP2    = toF32(-1.6666654611e-1)
	cosP0    = toF32(2.443315711809948e-005)
	cosP1    = toF32(-1.388731625493765e-003)
	cosP2    = toF32(4.166664568298827e-002)
	fourOvPi = toF32(1.27323954473516)
)

const (
	minNormPos  = 0x00800000
	invMantMask = ^uint32(0x7f800000)
	signMask    = 0x80000000
)

// avxLog is log256_ps for one lane: NaN for x <= 0, denormals cut to the smallest normal.
func avxLog(x float32) float32 {
	invalid := x <= 0
	if !(x > math.Float32frombits(minNormPos)) { // _mm256_max_ps(x, min_norm_pos): NaN x gives min
		x = math.Float32frombits(minNormPos)
	}
	bits := math.Float32bits(x)
	imm0 := int32(bits >> 23)
	x = math.Float32frombits(bits&invMantMask | math.Float32bits(0.5))
	imm0 -= 0x7f
	e := float32(imm0)
	e += 1

	// if x < SQRTHF { e -= 1; x = x + x - 1 } else { x = x - 1 }, done without branches
	var tmp, one float32
	if x < cephesSQRTHF {
		tmp, one = x, 1
	}
	x -= 1
	e -= one
	x += tmp

	z := float32(x * x)
	y := logP0
	y = fma32(y, x, logP1)
	y = fma32(y, x, logP2)
	y = fma32(y, x, logP3)
	y = fma32(y, x, logP4)
	y = fma32(y, x, logP5)
	y = fma32(y, x, logP6)
	y = fma32(y, x, logP7)
	y = fma32(y, x, logP8)
	y = float32(y * x)
	y = fma32(y, z, float32(e*logQ1)) // y*z + e*q1: the earlier product is fused
	y = fma32(-z, 0.5, y)
	x += y
	x = fma32(e, logQ2, x)
	if invalid {
		return math.Float32frombits(0xffffffff) // x | all-ones mask: a NaN
	}
	return x
}

// avxSincos is sincos256_ps for one lane.
func avxSincos(x float32) (sin, cos float32) {
	xb := math.Float32bits(x)
	signSin := xb & signMask
	x = math.Float32frombits(xb &^ signMask)

	y := float32(x * fourOvPi)
	j := int32(y) // _mm256_cvttps_epi32 (truncation); y is small and positive here
	if y >= 2147483648 || y != y {
		j = math.MinInt32 // the instruction's "integer indefinite"
	}
	j = (j + 1) &^ 1
	y = float32(j)
	j4 := j

	swapSignSin := uint32(j&4) << 29
	polyMask := j&2 == 0

	x = fma32(y, minusDP1, x)
	x = fma32(y, minusDP2, x)
	x = fma32(y, minusDP3, x)

	j4 -= 2
	signCos := uint32(^j4&4) << 29
	signSin ^= swapSignSin

	z := float32(x * x)
	yc := cosP0
	yc = fma32(yc, z, cosP1)
	yc = fma32(yc, z, cosP2)
	yc = float32(yc * z)
	yc = fma32(yc, z, -float32(z*0.5)) // yc*z - z*0.5: the earlier product is fused
	yc += 1

	ys := sinP0
	ys = fma32(ys, z, sinP1)
	ys = fma32(ys, z, sinP2)
	ys = float32(ys * z)
	ys = fma32(ys, x, x)

	// Select per lane with masks: ysin2 = mask&ys, ysin1 = ^mask&yc.
	var ysin1, ysin2 float32
	if polyMask {
		ysin2 = ys
	} else {
		ysin1 = yc
	}
	ys -= ysin2
	yc -= ysin1
	s := ysin1 + ysin2
	c := yc + ys
	sin = math.Float32frombits(math.Float32bits(s) ^ signSin)
	cos = math.Float32frombits(math.Float32bits(c) ^ signCos)
	return sin, cos
}

// fma32 returns a*b+c rounded once to float32, as vfmadd does.
func fma32(a, b, c float32) float32 {
	// The product of two floats is exact in float64; TwoSum gives the sum's rounding error.
	p := float64(a) * float64(b)
	cc := float64(c)
	s := p + cc
	bv := s - p
	err := (p - (s - bv)) + (cc - bv)
	f := float32(s)
	// Where float32 is normal, rounding drops the low 29 bits of float64's mantissa, and s is
	// a tie only when those bits are exactly 1 followed by 28 zeros: the common, fast case.
	if e := math.Float64bits(s) >> 52 & 0x7ff; e >= 1023-126 && e <= 1023+127 && math.Float64bits(s)&(1<<29-1) != 1<<28 {
		return f
	}
	if err == 0 || math.IsInf(s, 0) || math.IsNaN(s) {
		return f
	}
	// Rounding s to float32 is right unless s sits exactly halfway between two floats, where the
	// tie must go the way the discarded error points.
	lo := f
	if float64(lo) > s {
		lo = math.Nextafter32(lo, float32(math.Inf(-1)))
	}
	hi := math.Nextafter32(lo, float32(math.Inf(1)))
	if s != (float64(lo)+float64(hi))/2 {
		return f
	}
	if err > 0 {
		return hi
	}
	return lo
}
