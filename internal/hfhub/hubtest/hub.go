// Package hubtest is an in-process Hugging Face hub for tests: two HTTP servers that behave as
// huggingface.co and its LFS storage do for downloads. The hub answers
// GET /api/models/{repo}/revision/{rev} (with ?blobs=true: sizes, blob ids, LFS sha256) and
// HEAD/GET /{repo}/resolve/{rev}/{path}: files stored in git directly with their git blob sha1
// as ETag, LFS files (*.safetensors and anything of 1 MiB or more) with a 302 to the second
// server and X-Linked-Etag (sha256), X-Linked-Size; X-Repo-Commit on both. Revisions are
// branches or full commit hashes; Range requests are served; refusals carry X-Error-Code and
// X-Error-Message as the hub's do (401 for anonymous requests to private, gated or missing
// repositories, 403 for a token without access to a gated one, 404 with RepoNotFound,
// RevisionNotFound or EntryNotFound; a gated repository's file list is public, its files are
// not). Faults can be injected per file.
package hubtest

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// LFSThreshold is the size from which a file is stored in LFS (besides *.safetensors).
const LFSThreshold = 1 << 20

// Hub is the fake hub. Its methods are safe for concurrent use.
type Hub struct {
	// API is huggingface.co; LFS is the storage host LFS files redirect to.
	API, LFS *httptest.Server

	mu       sync.Mutex // mu protects the fields below
	repos    map[string]*repo
	tokens   map[string]bool // known tokens → access to gated repositories
	faults   map[string]*Fault
	requests []Request
	blobs    map[string][]byte // LFS contents by sha256
	renamed  map[string]string // old repository id → new
	stalled  chan string
}

type repo struct {
	gated   bool
	commits map[string]map[string][]byte
	refs    map[string]string
}

// Request is one request a server received.
type Request struct {
	// Server is "api" or "lfs".
	Server string
	// Method and Path (unescaped) of the request; Range and Authorization headers as sent.
	Method, Path, Range, Authorization string
}

// Fault makes the hub misbehave for one file.
type Fault struct {
	// Status answers GETs and HEADs of the file with this status.
	Status int
	// DropAt closes the connection once the file's bytes up to this offset are sent (GET only;
	// a request starting at or after it is not dropped).
	DropAt int64
	// StallAt sends the file's bytes up to this offset, then sends nothing more until the
	// client goes away (a pull killed mid-file); Stalled is told the file's key then.
	StallAt int64
	// Corrupt serves the file with one byte changed (same size, same headers).
	Corrupt bool
	// Times is how many requests the fault applies to (0: every one).
	Times int
}

// New starts a hub; Close stops it.
func New() *Hub {
	h := &Hub{repos: map[string]*repo{}, tokens: map[string]bool{}, faults: map[string]*Fault{}, blobs: map[string][]byte{},
		renamed: map[string]string{}, stalled: make(chan string, 16)}
	h.API = httptest.NewServer(h.logged("api", http.HandlerFunc(h.route)))
	lfs := http.NewServeMux()
	lfs.HandleFunc("/lfs/{sha}", h.lfs)
	h.LFS = httptest.NewServer(h.logged("lfs", lfs))
	return h
}

// route dispatches the hub's two URL forms (ServeMux patterns for both would overlap). A
// renamed repository's URLs redirect, with a relative Location, to the new name.
func (h *Hub) route(w http.ResponseWriter, r *http.Request) {
	if rest, ok := strings.CutPrefix(r.URL.Path, "/api/models/"); ok {
		p := strings.SplitN(rest, "/", 4) // org, name, "revision", rev
		if len(p) == 4 && p[2] == "revision" && r.Method == http.MethodGet {
			if h.redirectRenamed(w, r, p[0]+"/"+p[1], "/api/models/", "/"+p[2]+"/"+p[3]) {
				return
			}
			h.info(w, r, p[0]+"/"+p[1], p[3])
			return
		}
	} else {
		p := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 5) // org, name, "resolve", rev, path
		if len(p) == 5 && p[2] == "resolve" {
			if h.redirectRenamed(w, r, p[0]+"/"+p[1], "/", "/resolve/"+p[3]+"/"+p[4]) {
				return
			}
			h.resolve(w, r, p[0]+"/"+p[1], p[3], p[4])
			return
		}
	}
	refuse(w, http.StatusNotFound, "", "not found")
}

// redirectRenamed answers a request for a renamed repository with a relative redirect.
func (h *Hub) redirectRenamed(w http.ResponseWriter, r *http.Request, id, prefix, suffix string) bool {
	h.mu.Lock()
	to, ok := h.renamed[id]
	h.mu.Unlock()
	if !ok {
		return false
	}
	loc := (&url.URL{Path: prefix + to + suffix, RawQuery: r.URL.RawQuery}).String()
	w.Header().Set("Location", loc)
	w.WriteHeader(http.StatusTemporaryRedirect)
	return true
}

// Rename moves a repository to a new id; the old id's URLs redirect to it.
func (h *Hub) Rename(from, to string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.repos[from]; ok {
		delete(h.repos, from)
		h.repos[to] = r
		h.renamed[from] = to
	}
}

// Close stops both servers.
func (h *Hub) Close() {
	h.API.CloseClientConnections()
	h.LFS.CloseClientConnections()
	h.API.Close()
	h.LFS.Close()
}

// Stalled receives "repo/path" each time a StallAt fault has sent its bytes.
func (h *Hub) Stalled() <-chan string { return h.stalled }

// Endpoint is the hub's URL (HF_ENDPOINT).
func (h *Hub) Endpoint() string { return h.API.URL }

func (h *Hub) logged(server string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.requests = append(h.requests, Request{Server: server, Method: r.Method, Path: r.URL.Path,
			Range: r.Header.Get("Range"), Authorization: r.Header.Get("Authorization")})
		h.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

// Requests returns the requests received so far.
func (h *Hub) Requests() []Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Request(nil), h.requests...)
}

// Push adds a commit with these files (path → contents) to repo's main branch, creating the
// repository when needed, and returns the commit hash.
func (h *Hub) Push(repoID string, files map[string][]byte) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.repos[repoID]
	if r == nil {
		r = &repo{commits: map[string]map[string][]byte{}, refs: map[string]string{}}
		h.repos[repoID] = r
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	c := sha1.New()
	fmt.Fprintf(c, "%s\x00parent %s\x00", repoID, r.refs["main"])
	snap := map[string][]byte{}
	for _, p := range paths {
		fmt.Fprintf(c, "%s\x00%s\x00", p, gitBlobID(files[p]))
		snap[p] = files[p]
		if isLFS(p, files[p]) {
			h.blobs[sha256Hex(files[p])] = files[p]
		}
	}
	commit := hex.EncodeToString(c.Sum(nil))
	r.commits[commit] = snap
	r.refs["main"] = commit
	return commit
}

// Remove deletes a repository (requests for it then get RepoNotFound).
func (h *Hub) Remove(repoID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.repos, repoID)
}

// SetGated makes a repository gated: anonymous requests get 401, tokens without access 403.
func (h *Hub) SetGated(repoID string, gated bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.repos[repoID]; r != nil {
		r.gated = gated
	}
}

// AddToken makes a token known, with or without access to gated repositories.
func (h *Hub) AddToken(token string, gatedAccess bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tokens[token] = gatedAccess
}

// SetFault makes the hub misbehave for one file of a repository (nil clears it).
func (h *Hub) SetFault(repoID, path string, f *Fault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if f == nil {
		delete(h.faults, repoID+"/"+path)
		return
	}
	cp := *f
	h.faults[repoID+"/"+path] = &cp
}

// fault returns the fault of a file and uses it up once; caller holds mu.
func (h *Hub) fault(key string) *Fault {
	f := h.faults[key]
	if f == nil {
		return nil
	}
	cp := *f
	if f.Times > 0 {
		f.Times--
		if f.Times == 0 {
			delete(h.faults, key)
		}
	}
	return &cp
}

func isLFS(path string, b []byte) bool {
	return strings.HasSuffix(path, ".safetensors") || len(b) >= LFSThreshold
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// gitBlobID is git's object id of a blob.
func gitBlobID(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// lfsPointer is the pointer file git stores for an LFS file.
func lfsPointer(b []byte) []byte {
	return fmt.Appendf(nil, "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", sha256Hex(b), len(b))
}

func refuse(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// access finds the repository and checks the request's token (gating applies to files only);
// it answers the refusal itself and returns nil then. Caller holds mu.
func (h *Hub) access(w http.ResponseWriter, r *http.Request, id string, files bool) *repo {
	auth := r.Header.Get("Authorization")
	token, hasToken := strings.CutPrefix(auth, "Bearer ")
	gatedOK, known := h.tokens[token]
	if auth != "" && (!hasToken || !known) {
		refuse(w, http.StatusUnauthorized, "", "Invalid credentials in Authorization header")
		return nil
	}
	rp := h.repos[id]
	switch {
	case rp == nil && auth == "":
		refuse(w, http.StatusUnauthorized, "RepoNotFound", "Repository Not Found for url: "+r.URL.String()+". Please make sure you specified the correct `repo_id` and `repo_type`. If you are trying to access a private or gated repo, make sure you are authenticated.")
		return nil
	case rp == nil:
		refuse(w, http.StatusNotFound, "RepoNotFound", "Repository Not Found for url: "+r.URL.String())
		return nil
	case rp.gated && !files: // a gated repository's metadata is public; its files are not
		return rp
	case rp.gated && auth == "":
		refuse(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+id+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
		return nil
	case rp.gated && !gatedOK:
		refuse(w, http.StatusForbidden, "GatedRepo", "Access to model "+id+" is restricted and you are not in the authorized list. Visit https://huggingface.co/"+id+" to ask for access.")
		return nil
	}
	return rp
}

// commitOf resolves a revision; caller holds mu.
func (rp *repo) commitOf(rev string) (string, bool) {
	if c, ok := rp.refs[rev]; ok {
		return c, true
	}
	_, ok := rp.commits[rev]
	return rev, ok
}

type sibling struct {
	Path   string   `json:"rfilename"`
	Size   int64    `json:"size,omitempty"`
	BlobID string   `json:"blobId,omitempty"`
	LFS    *lfsInfo `json:"lfs,omitempty"`
}

type lfsInfo struct {
	SHA256      string `json:"sha256"`
	Size        int64  `json:"size"`
	PointerSize int64  `json:"pointerSize"`
}

func (h *Hub) info(w http.ResponseWriter, r *http.Request, id, rev string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rp := h.access(w, r, id, false)
	if rp == nil {
		return
	}
	commit, ok := rp.commitOf(rev)
	if !ok {
		refuse(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return
	}
	blobs := r.URL.Query().Get("blobs") == "true"
	files := rp.commits[commit]
	out := struct {
		ID       string    `json:"id"`
		ModelID  string    `json:"modelId"`
		SHA      string    `json:"sha"`
		Gated    any       `json:"gated"`
		Siblings []sibling `json:"siblings"`
	}{ID: id, ModelID: id, SHA: commit, Gated: false}
	if rp.gated {
		out.Gated = "auto"
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		s := sibling{Path: p}
		if blobs {
			b := files[p]
			s.Size, s.BlobID = int64(len(b)), gitBlobID(b)
			if isLFS(p, b) {
				ptr := lfsPointer(b)
				s.BlobID = gitBlobID(ptr)
				s.LFS = &lfsInfo{SHA256: sha256Hex(b), Size: int64(len(b)), PointerSize: int64(len(ptr))}
			}
		}
		out.Siblings = append(out.Siblings, s)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (h *Hub) resolve(w http.ResponseWriter, r *http.Request, id, rev, path string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	h.mu.Lock()
	rp := h.access(w, r, id, true)
	if rp == nil {
		h.mu.Unlock()
		return
	}
	commit, ok := rp.commitOf(rev)
	if !ok {
		h.mu.Unlock()
		refuse(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return
	}
	b, ok := rp.commits[commit][path]
	if !ok {
		h.mu.Unlock()
		refuse(w, http.StatusNotFound, "EntryNotFound", path+" does not exist on \""+rev+"\"")
		return
	}
	lfs := isLFS(path, b)
	key := id + "/" + path
	var f *Fault
	if ff := h.faults[key]; ff != nil {
		switch {
		case ff.Status != 0: // refusals: at the resolve URL, HEAD and GET
			f = h.fault(key)
		case !lfs && r.Method == http.MethodGet: // body faults of git files: at the resolve URL
			f = h.fault(key)
		}
	}
	h.mu.Unlock()

	if f != nil && f.Status != 0 {
		refuse(w, f.Status, "", http.StatusText(f.Status))
		return
	}
	w.Header().Set("X-Repo-Commit", commit)
	if !lfs {
		w.Header().Set("ETag", `"`+gitBlobID(b)+`"`)
		h.serve(w, r, b, f, key)
		return
	}
	sum := sha256Hex(b)
	ptr := lfsPointer(b)
	w.Header().Set("ETag", `"`+gitBlobID(ptr)+`"`)
	w.Header().Set("X-Linked-Etag", `"`+sum+`"`)
	w.Header().Set("X-Linked-Size", strconv.Itoa(len(b)))
	q := url.Values{"file": {id + "/" + path}, "X-Amz-Signature": {sum[:16]}}
	w.Header().Set("Location", h.LFS.URL+"/lfs/"+sum+"?"+q.Encode())
	w.WriteHeader(http.StatusFound)
}

func (h *Hub) lfs(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	b, ok := h.blobs[r.PathValue("sha")]
	var f *Fault
	if key := r.URL.Query().Get("file"); ok && r.Method == http.MethodGet && h.faults[key] != nil && h.faults[key].Status == 0 {
		f = h.fault(key)
	}
	h.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	w.Header().Set("ETag", `"`+r.PathValue("sha")+`"`)
	h.serve(w, r, b, f, r.URL.Query().Get("file"))
}

// serve answers a GET or HEAD of b with Range support, applying a fault.
func (h *Hub) serve(w http.ResponseWriter, r *http.Request, b []byte, f *Fault, key string) {
	if f != nil && f.Corrupt && len(b) > 0 {
		b = append([]byte(nil), b...)
		b[len(b)/2] ^= 0xff
	}
	start := int64(0)
	status := http.StatusOK
	if rg := r.Header.Get("Range"); rg != "" {
		spec, ok := strings.CutPrefix(rg, "bytes=")
		from, _, ok2 := strings.Cut(spec, "-")
		n, err := strconv.ParseInt(from, 10, 64)
		if !ok || !ok2 || err != nil || n < 0 {
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		if n >= int64(len(b)) {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", len(b)))
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		start, status = n, http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, len(b)-1, len(b)))
	}
	w.Header().Set("Accept-Ranges", "bytes")
	w.Header().Set("Content-Length", strconv.FormatInt(int64(len(b))-start, 10))
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	body := b[start:]
	if f != nil && f.DropAt > start && f.DropAt < int64(len(b)) {
		_, _ = w.Write(b[start:f.DropAt])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		panic(http.ErrAbortHandler) // drops the connection mid-body
	}
	if f != nil && f.StallAt > start && f.StallAt < int64(len(b)) {
		_, _ = w.Write(b[start:f.StallAt])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		select {
		case h.stalled <- key:
		default:
		}
		<-r.Context().Done()
		panic(http.ErrAbortHandler)
	}
	_, _ = w.Write(body)
}

// FixtureRepos maps the folders of the tiny fixture models (testdata/parity/models, see its
// README) to the repositories they stand for.
var FixtureRepos = map[string]string{
	"hunyuanvideo":   "hunyuanvideo-community/HunyuanVideo",
	"flux_redux_bfl": "lllyasviel/flux_redux_bfl",
	"framepack_i2v":  "lllyasviel/FramePackI2V_HY",
	"framepack_f1":   "lllyasviel/FramePack_F1_I2V_HY_20250503",
}

// Decoys are files the fake repositories also hold that a FramePack pull must not download
// (as the real ones do: HunyuanVideo's own transformer, FLUX Redux's embedder).
var Decoys = map[string][]string{
	"hunyuanvideo-community/HunyuanVideo": {"transformer/config.json", "transformer/diffusion_pytorch_model.safetensors", "model_index.json"},
	"lllyasviel/flux_redux_bfl":           {"image_embedder/config.json", "image_embedder/diffusion_pytorch_model.safetensors"},
	"lllyasviel/FramePackI2V_HY":          {"README.md"},
}

// PushFixtures pushes the fixture models under modelsDir as the FramePack repositories (one
// commit each, with the Decoys) and returns the commit of each repository.
func (h *Hub) PushFixtures(modelsDir string) (map[string]string, error) {
	commits := map[string]string{}
	for dir, id := range FixtureRepos {
		files := map[string][]byte{}
		root := filepath.Join(modelsDir, dir)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			files[filepath.ToSlash(rel)] = b
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("push fixtures %s: %w", root, err)
		}
		for _, d := range Decoys[id] {
			files[d] = []byte("decoy " + d + "\n")
		}
		commits[id] = h.Push(id, files)
	}
	return commits, nil
}
