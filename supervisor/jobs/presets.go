package jobs

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// bucketPresets holds the presets: name → framepack.v1.Preset (binary proto).
var bucketPresets = []byte("presets")

// ErrPresetNotFound is returned for a preset name the store does not know.
var ErrPresetNotFound = errors.New("jobs: preset not found")

// MaxPresetName is the longest preset name, in bytes.
const MaxPresetName = 64

// CheckPresetName says what is wrong with a preset name, nil when nothing: 1 to 64 letters,
// digits, spaces and ._- characters, not starting or ending with a space.
func CheckPresetName(name string) error {
	switch {
	case name == "":
		return errors.New("required: 1 to 64 letters, digits, spaces and ._- characters")
	case len(name) > MaxPresetName:
		return fmt.Errorf("%d bytes, the limit is %d", len(name), MaxPresetName)
	case !utf8.ValidString(name):
		return errors.New("not valid UTF-8")
	case strings.TrimSpace(name) != name:
		return errors.New("starts or ends with a space")
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(" ._-", r)) {
			return fmt.Errorf("character %q: only letters, digits, spaces and ._- are allowed", r)
		}
	}
	return nil
}

// SavePreset stores a preset under its name, replacing one of the same name, and returns it
// with its update time. The caller has checked it.
func (s *Store) SavePreset(p *framepackv1.Preset) (*framepackv1.Preset, error) {
	out := proto.Clone(p).(*framepackv1.Preset)
	out.UpdateTime = timestamppb.New(s.now())
	raw, err := proto.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("save preset %q: %w", p.GetName(), err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPresets).Put([]byte(p.GetName()), raw)
	}); err != nil {
		return nil, fmt.Errorf("save preset %q: %w", p.GetName(), err)
	}
	return out, nil
}

// Preset returns the named preset (ErrPresetNotFound when there is none).
func (s *Store) Preset(name string) (*framepackv1.Preset, error) {
	var out *framepackv1.Preset
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketPresets).Get([]byte(name))
		if raw == nil {
			return ErrPresetNotFound
		}
		out = &framepackv1.Preset{}
		return proto.Unmarshal(raw, out)
	})
	if err != nil {
		return nil, fmt.Errorf("preset %q: %w", name, err)
	}
	return out, nil
}

// Presets returns every preset, by name.
func (s *Store) Presets() ([]*framepackv1.Preset, error) {
	var out []*framepackv1.Preset
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPresets).ForEach(func(_, raw []byte) error {
			p := &framepackv1.Preset{}
			if err := proto.Unmarshal(raw, p); err != nil {
				return err
			}
			out = append(out, p)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list presets: %w", err)
	}
	return out, nil
}

// DeletePreset removes the named preset (ErrPresetNotFound when there is none).
func (s *Store) DeletePreset(name string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPresets)
		if b.Get([]byte(name)) == nil {
			return ErrPresetNotFound
		}
		return b.Delete([]byte(name))
	})
	if err != nil {
		return fmt.Errorf("delete preset %q: %w", name, err)
	}
	return nil
}

// ApplyPreset returns spec with every field it leaves unset filled from the preset's spec: a
// field counts as set when it holds a non-zero value, an optional field when present, a list
// when not empty (protobuf's presence). The result names the preset in JobSpec.preset.
func ApplyPreset(spec *framepackv1.JobSpec, preset *framepackv1.Preset) *framepackv1.JobSpec {
	out := FillUnset(spec, preset.GetSpec())
	out.Preset = preset.GetName()
	return out
}

// FillUnset returns a copy of spec with every field it leaves unset (protobuf presence, as
// ApplyPreset) taken from from; spec may be nil.
func FillUnset(spec, from *framepackv1.JobSpec) *framepackv1.JobSpec {
	out := &framepackv1.JobSpec{}
	if spec != nil {
		out = proto.Clone(spec).(*framepackv1.JobSpec)
	}
	dst := out.ProtoReflect()
	from.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if !dst.Has(fd) {
			dst.Set(fd, cloneValue(fd, v))
		}
		return true
	})
	return out
}

// cloneValue copies a field's value so that the result shares no message or list with the preset.
func cloneValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch {
	case fd.IsList():
		src := v.List()
		dst := (&framepackv1.JobSpec{}).ProtoReflect().NewField(fd).List()
		for i := range src.Len() {
			e := src.Get(i)
			if fd.Message() != nil {
				e = protoreflect.ValueOfMessage(proto.Clone(e.Message().Interface()).ProtoReflect())
			}
			dst.Append(e)
		}
		return protoreflect.ValueOfList(dst)
	case fd.Message() != nil:
		return protoreflect.ValueOfMessage(proto.Clone(v.Message().Interface()).ProtoReflect())
	case fd.Kind() == protoreflect.BytesKind:
		return protoreflect.ValueOfBytes(append([]byte(nil), v.Bytes()...))
	}
	return v
}
