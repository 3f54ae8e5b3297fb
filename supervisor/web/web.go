// Package web is framepackd's web page, embedded in the binary and served at / by
// supervisor/httpapi: a start image and FramePack's settings, a live view of the running job
// (step progress with ETA, the latent preview of each step, the video so far playing as each
// section arrives), the queue with cancel and download, and the devices panel.
//
// It is plain HTML, CSS and modern JavaScript (static/), no build step and nothing fetched from
// elsewhere; every response carries a strict Content-Security-Policy: scripts, styles, media
// and connections only from the page's own origin, images also from blob: (previews are PNG
// bytes from the event stream), no inline script or style, no framing.
package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// CSP is the Content-Security-Policy of every page response.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; media-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Handler serves the page and its assets.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
