package httpapi

import (
	"io"
	"mime/multipart"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/framepackd/framepackd/supervisor/api"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// extraParts are the multipart submit's file parts beyond the image and end image: "keyframe"
// (one per JobSpec.keyframes entry that has no image, in order) and "input_video".
type extraParts struct {
	keyframes [][]byte
	video     []byte
	haveVideo bool
}

// read takes one "keyframe" or "input_video" part: images up to maxImage bytes, the video up to
// the API's request limit (the server checks its own --max-video-bytes).
func (x *extraParts) read(part *multipart.Part, maxImage int64) error {
	name := part.FormName()
	limit := maxImage
	if name == "input_video" {
		if x.haveVideo {
			return status.Error(codes.InvalidArgument, `multipart body has two "input_video" parts`)
		}
		x.haveVideo, limit = true, api.MaxRequestBytes
	}
	data, err := io.ReadAll(io.LimitReader(part, limit+1))
	if err != nil {
		return bodyError("read "+name+" part", err)
	}
	switch {
	case int64(len(data)) > limit:
		return status.Errorf(codes.InvalidArgument, "%s: more than %d bytes", name, limit)
	case len(data) == 0:
		return status.Errorf(codes.InvalidArgument, "multipart %q part is empty", name)
	}
	if name == "input_video" {
		x.video = data
	} else {
		x.keyframes = append(x.keyframes, data)
	}
	return nil
}

// apply puts the parts into spec: each keyframe part into the next keyframe without an image,
// the video into input_video.
func (x *extraParts) apply(spec *framepackv1.JobSpec) error {
	if x.haveVideo {
		if len(spec.GetInputVideo()) > 0 || spec.GetInputVideoJobId() != "" {
			return status.Error(codes.InvalidArgument, `the input video is given twice: as the "input_video" part and in the spec`)
		}
		spec.InputVideo = x.video
	}
	if len(x.keyframes) == 0 {
		return nil
	}
	next := 0
	for _, k := range spec.GetKeyframes() {
		if len(k.GetImage()) > 0 {
			continue
		}
		if next == len(x.keyframes) {
			break
		}
		k.Image = x.keyframes[next]
		next++
	}
	if next != len(x.keyframes) || next == 0 {
		missing := 0
		for _, k := range spec.GetKeyframes() {
			if len(k.GetImage()) == 0 {
				missing++
			}
		}
		return status.Errorf(codes.InvalidArgument, `%d "keyframe" parts for %d keyframes of the spec without an image: give spec.keyframes one entry (section or seconds) per keyframe part, in order`,
			len(x.keyframes), missing+next)
	}
	return nil
}
