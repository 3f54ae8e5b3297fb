package hfhub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors a caller can act on; the errors returned wrap them (errors.Is) and say which repository
// and file they are about.
var (
	// ErrUnauthorized: the hub answered 401 or 403 (a gated or private repository, a bad token).
	ErrUnauthorized = errors.New("not authorized")
	// ErrNotFound: the hub answered 404 (repository, revision or file).
	ErrNotFound = errors.New("not found")
	// ErrOffline: HF_HUB_OFFLINE is set and the files are not in the cache.
	ErrOffline = errors.New("offline mode (HF_HUB_OFFLINE) and not in the cache")
	// ErrChecksum: a downloaded file does not hash to its ETag; it is not linked.
	ErrChecksum = errors.New("checksum mismatch")
	// ErrTruncated: the transfer ended before the file was complete; the partial blob is kept
	// and the next pull resumes it.
	ErrTruncated = errors.New("transfer ended early")
	// ErrNoSpace: the files do not fit the free disk space.
	ErrNoSpace = errors.New("not enough disk space")
	// ErrProtocol: the hub's answer lacks what the protocol promises (an ETag, a commit).
	ErrProtocol = errors.New("unexpected answer from the hub")
)

// HTTPError is a refusal by the hub: its status, the hub's X-Error-Code and X-Error-Message,
// and what was asked.
type HTTPError struct {
	Status  int
	Code    string // X-Error-Code: RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo, …
	Message string // X-Error-Message, else the start of the body
	Repo    string
	Path    string // the file, empty for a repository request
	Rev     string
	HadAuth bool // a token was sent
}

// Error says what failed and what to do about it.
func (e *HTTPError) Error() string {
	what := "repository " + e.Repo
	if e.Path != "" {
		what = fmt.Sprintf("%s in %s", e.Path, what)
	}
	if e.Rev != "" {
		what += " at revision " + e.Rev
	}
	var hint string
	switch {
	case e.Status == http.StatusUnauthorized && e.HadAuth:
		hint = "the hub refused the token in HF_TOKEN: check it at https://huggingface.co/settings/tokens"
	case e.Status == http.StatusUnauthorized:
		hint = "the repository is gated or private (or does not exist): set HF_TOKEN to a token that has access (https://huggingface.co/settings/tokens)"
	case e.Status == http.StatusForbidden:
		hint = fmt.Sprintf("this token has no access: accept the repository's terms at https://huggingface.co/%s, or use a token with access in HF_TOKEN", e.Repo)
	case e.Code == "RevisionNotFound":
		hint = "no such branch, tag or commit"
	case e.Code == "EntryNotFound":
		hint = "the file is not in the repository at this revision"
	case e.Status == http.StatusNotFound:
		hint = "check the repository name, and HF_ENDPOINT if you use a mirror"
	default:
		hint = "try again later"
	}
	msg := ""
	if e.Code != "" {
		msg = " " + e.Code
	}
	if e.Message != "" {
		msg += " (" + e.Message + ")"
	}
	return fmt.Sprintf("%s: HTTP %d%s: %s", what, e.Status, msg, hint)
}

// Unwrap maps the status to ErrUnauthorized or ErrNotFound.
func (e *HTTPError) Unwrap() error {
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return ErrUnauthorized
	case http.StatusNotFound:
		return ErrNotFound
	}
	return nil
}

// Client talks to one hub endpoint.
type Client struct {
	// Endpoint is the hub's base URL (no trailing slash).
	Endpoint string
	// Token is sent as "Authorization: Bearer" to the endpoint's host only.
	Token string
	// HTTP is the transport; nil means a client with connect and header timeouts. Redirects are
	// handled by Client itself.
	HTTP *http.Client
	// UserAgent names the client in requests.
	UserAgent string

	once sync.Once
	hc   *http.Client // built once from HTTP: connections are reused across requests
}

// NewClient returns a Client for env.
func NewClient(env Env) *Client {
	return &Client{Endpoint: env.Endpoint, Token: env.Token}
}

func (c *Client) httpClient() *http.Client {
	c.once.Do(func() {
		hc := http.Client{}
		if c.HTTP != nil {
			hc = *c.HTTP
		} else {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.ResponseHeaderTimeout = 60 * time.Second
			hc.Transport = t
		}
		hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		c.hc = &hc
	})
	return c.hc
}

// repoPath is "org/name" with each part escaped.
func repoPath(repo string) string {
	parts := strings.Split(repo, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

// filePath escapes each segment of a file path in a repository.
func filePath(p string) string { return repoPath(p) }

// ResolveURL is the URL of a file at a revision: {endpoint}/{repo}/resolve/{rev}/{path}.
func (c *Client) ResolveURL(repo, rev, path string) string {
	return fmt.Sprintf("%s/%s/resolve/%s/%s", c.Endpoint, repoPath(repo), url.PathEscape(rev), filePath(path))
}

// do sends req, adding the token when the request goes to the endpoint's host, and follows
// redirects to the same host (a renamed repository) itself. Redirects to another host are
// returned to the caller.
func (c *Client) do(req *http.Request) (*http.Response, error) {
	hc := c.httpClient()
	for range 10 {
		if c.UserAgent != "" {
			req.Header.Set("User-Agent", c.UserAgent)
		}
		if c.Token != "" && c.sameHost(req.URL) {
			req.Header.Set("Authorization", "Bearer "+c.Token)
		} else {
			req.Header.Del("Authorization")
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode < 300 || resp.StatusCode > 399 {
			return resp, nil
		}
		loc, err := resp.Location()
		if err != nil {
			return resp, nil
		}
		if loc.Host != req.URL.Host || loc.Scheme != req.URL.Scheme {
			return resp, nil
		}
		drain(resp)
		next := req.Clone(req.Context())
		next.URL = loc
		next.Host = ""
		req = next
	}
	return nil, fmt.Errorf("%s: too many redirects", req.URL)
}

func (c *Client) sameHost(u *url.URL) bool {
	e, err := url.Parse(c.Endpoint)
	return err == nil && e.Host == u.Host && e.Scheme == u.Scheme
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// refusal turns a non-success answer into an *HTTPError.
func (c *Client) refusal(resp *http.Response, repo, path, rev string) error {
	e := &HTTPError{Status: resp.StatusCode, Code: resp.Header.Get("X-Error-Code"), Message: resp.Header.Get("X-Error-Message"),
		Repo: repo, Path: path, Rev: rev, HadAuth: resp.Request != nil && resp.Request.Header.Get("Authorization") != ""}
	if e.Message == "" && resp.Request != nil && resp.Request.Method != http.MethodHead {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		var body struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &body) == nil && body.Error != "" {
			e.Message = body.Error
		} else {
			e.Message = strings.TrimSpace(string(b))
		}
	}
	drain(resp)
	return e
}

// Sibling is one file of a repository as the hub lists it.
type Sibling struct {
	// Path is the file's path in the repository ("vae/config.json").
	Path string `json:"rfilename"`
	// Size is the file's size in bytes (for LFS files, the real file's size).
	Size int64 `json:"size"`
	// BlobID is the git blob id (sha1) of the file, or of its LFS pointer.
	BlobID string `json:"blobId"`
	// LFS is set for files stored with git-lfs.
	LFS *LFSInfo `json:"lfs,omitempty"`
}

// LFSInfo describes a file stored with git-lfs.
type LFSInfo struct {
	// SHA256 is the file's sha256 (hex): its ETag and blob name.
	SHA256 string `json:"sha256"`
	// Size is the file's size in bytes.
	Size int64 `json:"size"`
}

// RepoInfo is a repository at one commit.
type RepoInfo struct {
	// ID is "org/name".
	ID string `json:"id"`
	// Commit is the commit the revision resolved to (40 hex digits).
	Commit string `json:"sha"`
	// Files are the repository's files at Commit.
	Files []Sibling `json:"siblings"`
}

// Info resolves rev to a commit and lists the repository's files at it
// (GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true).
func (c *Client) Info(ctx context.Context, repo, rev string) (*RepoInfo, error) {
	u := fmt.Sprintf("%s/api/models/%s/revision/%s?blobs=true", c.Endpoint, repoPath(repo), url.PathEscape(rev))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("repository %s: %w", repo, err)
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, fmt.Errorf("repository %s: ask %s: %w", repo, c.Endpoint, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, c.refusal(resp, repo, "", rev)
	}
	defer resp.Body.Close()
	var info RepoInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&info); err != nil {
		return nil, fmt.Errorf("repository %s: %w: file list: %v", repo, ErrProtocol, err)
	}
	if !isCommit(info.Commit) {
		return nil, fmt.Errorf("repository %s revision %s: %w: commit %q", repo, rev, ErrProtocol, info.Commit)
	}
	if info.ID == "" {
		info.ID = repo
	}
	return &info, nil
}

// FileMeta is what a HEAD of a file's resolve URL says.
type FileMeta struct {
	// Commit is X-Repo-Commit.
	Commit string
	// ETag is X-Linked-Etag (LFS: the sha256) or ETag (git: the blob sha1), unquoted.
	ETag string
	// Size is X-Linked-Size or Content-Length.
	Size int64
	// Location is where to GET the file: the redirect's target for LFS files, else the
	// resolve URL.
	Location string
}

// Head asks for a file's metadata without following a redirect to another host.
func (c *Client) Head(ctx context.Context, repo, rev, path string) (FileMeta, error) {
	u := c.ResolveURL(repo, rev, path)
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, u, nil)
	if err != nil {
		return FileMeta{}, fmt.Errorf("%s in %s: %w", path, repo, err)
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := c.do(req)
	if err != nil {
		return FileMeta{}, fmt.Errorf("%s in %s: ask %s: %w", path, repo, c.Endpoint, err)
	}
	drain(resp)
	if resp.StatusCode >= 400 {
		return FileMeta{}, c.refusal(resp, repo, path, rev)
	}
	m := FileMeta{Commit: resp.Header.Get("X-Repo-Commit"), Location: resp.Request.URL.String()}
	m.ETag = normalizeETag(resp.Header.Get("X-Linked-Etag"))
	if m.ETag == "" {
		m.ETag = normalizeETag(resp.Header.Get("ETag"))
	}
	size := resp.Header.Get("X-Linked-Size")
	if size == "" {
		size = resp.Header.Get("Content-Length")
	}
	if m.Size, err = strconv.ParseInt(size, 10, 64); err != nil || m.Size < 0 {
		return FileMeta{}, fmt.Errorf("%s in %s: %w: no size (X-Linked-Size %q)", path, repo, ErrProtocol, size)
	}
	if resp.StatusCode >= 300 {
		loc, err := resp.Location()
		if err != nil {
			return FileMeta{}, fmt.Errorf("%s in %s: %w: redirect without Location", path, repo, ErrProtocol)
		}
		m.Location = loc.String()
	}
	if m.ETag == "" || strings.ContainsAny(m.ETag, "/\\") {
		return FileMeta{}, fmt.Errorf("%s in %s: %w: no usable ETag (%q)", path, repo, ErrProtocol, m.ETag)
	}
	if !isCommit(m.Commit) {
		return FileMeta{}, fmt.Errorf("%s in %s: %w: X-Repo-Commit %q", path, repo, ErrProtocol, m.Commit)
	}
	return m, nil
}

// Open GETs a file from location starting at offset. It returns the body and the offset the
// body starts at (0 when the server ignored the range).
func (c *Client) Open(ctx context.Context, repo, path, location string, offset int64) (io.ReadCloser, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, location, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("%s in %s: %w", path, repo, err)
	}
	req.Header.Set("Accept-Encoding", "identity")
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("%s in %s: download: %w", path, repo, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return resp.Body, 0, nil
	case http.StatusPartialContent:
		start, ok := contentRangeStart(resp.Header.Get("Content-Range"))
		if !ok || start != offset {
			drain(resp)
			return nil, 0, fmt.Errorf("%s in %s: %w: Content-Range %q for offset %d", path, repo, ErrProtocol, resp.Header.Get("Content-Range"), offset)
		}
		return resp.Body, offset, nil
	case http.StatusRequestedRangeNotSatisfiable:
		drain(resp)
		return nil, 0, errRangeNotSatisfiable
	}
	return nil, 0, c.refusal(resp, repo, path, "")
}

var errRangeNotSatisfiable = errors.New("range not satisfiable")

func contentRangeStart(v string) (int64, bool) {
	v, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, false
	}
	start, _, ok := strings.Cut(v, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(start, 10, 64)
	return n, err == nil
}

// normalizeETag drops a weak prefix and the quotes.
func normalizeETag(v string) string {
	v = strings.TrimPrefix(strings.TrimSpace(v), "W/")
	return strings.Trim(v, `"`)
}

// isCommit reports whether s is a full commit hash.
func isCommit(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, r := range s {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}
