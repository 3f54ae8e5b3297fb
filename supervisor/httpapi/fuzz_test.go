package httpapi

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzReadMultipart feeds arbitrary multipart bodies to the submit parser: it must return a
// request with an image and a spec, or an INVALID_ARGUMENT status (or the body-limit error),
// never panic.
func FuzzReadMultipart(f *testing.F) {
	f.Add([]byte("--xx\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\r\n\x89PNG\r\n--xx\r\nContent-Disposition: form-data; name=\"spec\"\r\n\r\n{\"prompt\":\"p\",\"totalSecondLength\":1}\r\n--xx--\r\n"))
	f.Add([]byte("--xx\r\nContent-Disposition: form-data; name=\"spec\"\r\n\r\n{\"steps\":\"x\"}\r\n--xx--\r\n"))
	f.Add([]byte("--xx\r\n\r\n--xx--"))
	f.Add([]byte{})
	h := &handler{cfg: Config{MaxUploadBytes: 1 << 16}}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/v1/jobs", bytes.NewReader(body))
		r.Header.Set("Content-Type", "multipart/form-data; boundary=xx")
		r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, h.bodyLimit())
		req, err := h.readMultipart(r)
		if err != nil {
			var mbe *http.MaxBytesError
			if st, ok := status.FromError(err); !errors.As(err, &mbe) && (!ok || st.Code() != codes.InvalidArgument) {
				t.Fatalf("error %v is not INVALID_ARGUMENT", err)
			}
			return
		}
		if req.GetSpec() == nil || int64(len(req.GetImage())) > h.cfg.MaxUploadBytes {
			t.Fatalf("accepted %v", req)
		}
	})
}
