// Package safetensors reads and writes the safetensors tensor file format: an 8-byte
// little-endian header length, a JSON header, then raw little-endian tensor data.
//
// It is the one tensor format of framepackd: model weights, parity fixtures, shared-memory
// segments between processes and job checkpoints all use it. Reads are mmap'd; every header is
// validated strictly before any tensor is touched, and every error names the file, the tensor
// and the problem.
package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DType is a tensor element type as spelled in a safetensors header.
type DType string

// The element types framepackd reads and writes.
const (
	F64  DType = "F64"
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
	I64  DType = "I64"
	I32  DType = "I32"
	U8   DType = "U8"
	Bool DType = "BOOL"
	// F8E4M3 and F8E5M2 are PyTorch's float8_e4m3fn and float8_e5m2 as safetensors spells them.
	F8E4M3 DType = "F8_E4M3"
	F8E5M2 DType = "F8_E5M2"
)

// Size returns the size of one element in bytes, or 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case F64, I64:
		return 8
	case F32, I32:
		return 4
	case F16, BF16:
		return 2
	case U8, Bool, F8E4M3, F8E5M2:
		return 1
	}
	return 0
}

// Valid reports whether d is one of the supported dtypes.
func (d DType) Valid() bool { return d.Size() != 0 }

// IsFloat reports whether d is a floating-point dtype.
func (d DType) IsFloat() bool {
	switch d {
	case F64, F32, F16, BF16, F8E4M3, F8E5M2:
		return true
	}
	return false
}

// IsFP8 reports whether d is an 8-bit float dtype.
func (d DType) IsFP8() bool { return d == F8E4M3 || d == F8E5M2 }

// E4M3ToF32 converts a float8_e4m3fn value to float32 exactly: no infinities, S.1111.111 is NaN.
func E4M3ToF32(q uint8) float32 {
	exp, mant := uint32(q>>3)&0xf, uint32(q)&7
	var v float32
	switch {
	case exp == 0xf && mant == 7:
		v = float32(math.NaN())
	case exp == 0:
		v = float32(mant) / 512 // subnormal: mant · 2^-9
	default:
		v = math.Float32frombits((exp+120)<<23 | mant<<20)
	}
	if q&0x80 != 0 {
		return -v
	}
	return v
}

// E5M2ToF32 converts a float8_e5m2 value (the top byte of an IEEE half) to float32 exactly.
func E5M2ToF32(q uint8) float32 { return F16ToF32(uint16(q) << 8) }

// F16ToF32 converts an IEEE 754 half-precision value to float32 exactly (subnormals, infinities
// and NaNs included).
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0:
		// Subnormal: value = mant * 2^-24, exactly representable in float32.
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// F32ToF16 converts a float32 to half precision with round-to-nearest-even, as PyTorch does.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		rem := mant & ((1 << shift) - 1)
		v := mant >> shift
		if rem > half || (rem == half && v&1 == 1) {
			v++
		}
		return sign | uint16(v)
	}
	v := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && v&1 == 1) {
		v++
	}
	return sign | uint16(v)
}

// BF16ToF32 converts a bfloat16 value to float32 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts a float32 to bfloat16 with round-to-nearest-even, as PyTorch does.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// decodeFloat32 converts n elements of raw little-endian data of dtype d into dst.
func decodeFloat32(dst []float32, raw []byte, d DType) error {
	le := binary.LittleEndian
	switch d {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(le.Uint64(raw[8*i:])))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(le.Uint16(raw[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(le.Uint16(raw[2*i:]))
		}
	case I64:
		for i := range dst {
			dst[i] = float32(int64(le.Uint64(raw[8*i:])))
		}
	case I32:
		for i := range dst {
			dst[i] = float32(int32(le.Uint32(raw[4*i:])))
		}
	case U8, Bool:
		for i := range dst {
			dst[i] = float32(raw[i])
		}
	case F8E4M3:
		for i := range dst {
			dst[i] = E4M3ToF32(raw[i])
		}
	case F8E5M2:
		for i := range dst {
			dst[i] = E5M2ToF32(raw[i])
		}
	default:
		return fmt.Errorf("unsupported dtype %q", d)
	}
	return nil
}

// decodeInt64 converts integer (or boolean) raw data into dst.
func decodeInt64(dst []int64, raw []byte, d DType) error {
	le := binary.LittleEndian
	switch d {
	case I64:
		for i := range dst {
			dst[i] = int64(le.Uint64(raw[8*i:]))
		}
	case I32:
		for i := range dst {
			dst[i] = int64(int32(le.Uint32(raw[4*i:])))
		}
	case U8, Bool:
		for i := range dst {
			dst[i] = int64(raw[i])
		}
	default:
		return fmt.Errorf("dtype %s is not an integer type", d)
	}
	return nil
}
