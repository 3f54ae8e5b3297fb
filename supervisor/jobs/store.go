package jobs

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/video"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Typed errors that callers act on.
var (
	// ErrNotFound is returned for a job id the store does not know.
	ErrNotFound = errors.New("jobs: job not found")
	// ErrBadPageToken is returned by List for a page token it did not make.
	ErrBadPageToken = errors.New("jobs: bad page token")
	// ErrLocked is returned by Open when another process holds the state directory.
	ErrLocked = errors.New("jobs: state directory in use by another process")
	// ErrBadCheckpoint is returned by SaveCheckpoint for a checkpoint that names missing files
	// or files outside the job directory.
	ErrBadCheckpoint = errors.New("jobs: bad checkpoint")
	// ErrRequestMismatch is returned by CreateOnce for a client request id that names a job
	// created from a different image or spec.
	ErrRequestMismatch = errors.New("jobs: client request id already used for a different request")
)

// DBFile is the bbolt database's file name inside the state directory.
const DBFile = "jobs.db"

// JobsDirName is the folder of per-job directories inside the state directory.
const JobsDirName = "jobs"

var (
	bucketJobs   = []byte("jobs")   // id → framepack.v1.Job (binary proto)
	bucketMeta   = []byte("meta")   // id → meta (JSON)
	bucketOrder  = []byte("order")  // seq (8 bytes, big endian) → id
	bucketEvents = []byte("events") // id → bucket of seq (8 bytes) → framepack.v1.JobEvent
	// client request id → job id (SubmitJobRequest.client_request_id); the job's meta keeps
	// the id too, so that Delete removes the entry with the job.
	bucketRequests = []byte("requests")
)

// meta is what the store keeps about a job besides the public Job message.
type meta struct {
	Seq   uint64 `json:"seq"`
	Input string `json:"input"`
	// End is the end image's file name in the job directory; empty without one.
	End string `json:"end,omitempty"`
	// Keyframes are the keyframe images' file names, in JobSpec.keyframes' order; Video is the
	// input video's (a job that extends a video, whose Input is then empty).
	Keyframes  []string    `json:"keyframes,omitempty"`
	Video      string      `json:"video,omitempty"`
	FirstStart time.Time   `json:"first_start,omitzero"`
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	// Request is the client request that created the job; empty without a client request id.
	Request ClientRequest `json:"request,omitzero"`
}

// ClientRequest names the submission that created a job, so that a repeat of it (a client
// that lost the answer and sends the request again) finds the job instead of creating another.
type ClientRequest struct {
	// ID is the client's SubmitJobRequest.client_request_id.
	ID string `json:"id"`
	// Hash is RequestHash of the submission's spec and image: a repeat with the same ID and a
	// different Hash is ErrRequestMismatch.
	Hash string `json:"hash"`
}

// RequestHash returns the hex SHA-256 of a submission: its spec (deterministic binary proto,
// end image included) and its image.
func RequestHash(spec *framepackv1.JobSpec, image []byte) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("hash request: %w", err)
	}
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
	h.Write(image)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Checkpoint is the resume point of a job: the last section whose outputs are complete on
// disk. The pipeline records one after every finished section (Job.SaveCheckpoint); after a
// restart the Runner gets it back in Job.Resume.
type Checkpoint struct {
	// Section is the last finished section, 0-based in generation order.
	Section int `json:"section"`
	// Sections is the job's total number of sections.
	Sections int `json:"sections"`
	// Variant is the sampling variant the job's sections ran with (the pipeline's variant
	// name, "i2v" or "f1"); a resumed job keeps it. Empty in checkpoints written before
	// variants were recorded, which were all "i2v".
	Variant string `json:"variant,omitempty"`
	// Files names the files the pipeline needs to go on (history latents, history pixels,
	// generator state, …), by a name the pipeline chooses, as paths relative to the job
	// directory. Every file must exist when the checkpoint is saved.
	Files map[string]string `json:"files,omitempty"`
	// VideoPath is the MP4 (or PNG directory) written after this section, absolute; optional.
	// It exists, or its parts file does (supervisor/video: joined when first read).
	VideoPath string `json:"video_path,omitempty"`
	// FrameCount is the number of frames of that video.
	FrameCount int `json:"frame_count,omitempty"`
	// Time is when the checkpoint was saved; the store sets it.
	Time time.Time `json:"time"`
}

// Dir is one job's directory in the state directory:
//
//	<state>/jobs/<id>/input.<png|jpg|webp>  the submitted image, byte for byte
//	<state>/jobs/<id>/spec.json             the spec with defaults (protojson, for people)
//	<state>/jobs/<id>/history/              what the pipeline keeps after each section
//	<state>/jobs/<id>/video/                the MP4s (or PNG directories) of the sections
type Dir string

// Path returns the directory itself.
func (d Dir) Path() string { return string(d) }

// History is the folder the pipeline writes its per-section history into.
func (d Dir) History() string { return filepath.Join(string(d), "history") }

// Videos is the folder of the job's videos.
func (d Dir) Videos() string { return filepath.Join(string(d), "video") }

// Thumbnail is the small JPEG of the job's video so far, replaced with every section video.
func (d Dir) Thumbnail() string { return filepath.Join(d.Videos(), "thumbnail.jpg") }

// Spec is the human-readable copy of the spec.
func (d Dir) Spec() string { return filepath.Join(string(d), "spec.json") }

// Store keeps jobs, their resume points and their event logs in a bbolt database in the
// state directory, and one directory per job beside it. It is safe for concurrent use.
type Store struct {
	dir string
	db  *bolt.DB
	now func() time.Time
}

// Open opens (creating if needed) the store in dir. Only one process may hold a state
// directory: a second Open fails with ErrLocked after a second. Job directories that have no
// record (a crash between writing the files and committing the record) are removed.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, JobsDirName), 0o700); err != nil {
		return nil, fmt.Errorf("open job store %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open job store %s: %w", dir, err)
	}
	db, err := bolt.Open(filepath.Join(dir, DBFile), 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("open job store %s: %w", dir, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("open job store %s: %w", dir, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketJobs, bucketMeta, bucketOrder, bucketEvents, bucketRequests, bucketPresets} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open job store %s: %w", dir, err)
	}
	s := &Store{dir: dir, db: db, now: time.Now}
	if err := s.removeOrphanDirs(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open job store %s: %w", dir, err)
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close job store: %w", err)
	}
	return nil
}

// StateDir returns the state directory.
func (s *Store) StateDir() string { return s.dir }

// JobDir returns the directory of job id (which need not exist).
func (s *Store) JobDir(id string) Dir { return Dir(filepath.Join(s.dir, JobsDirName, id)) }

func (s *Store) removeOrphanDirs() error {
	entries, err := os.ReadDir(filepath.Join(s.dir, JobsDirName))
	if err != nil {
		return err
	}
	return s.db.View(func(tx *bolt.Tx) error {
		jobs := tx.Bucket(bucketJobs)
		for _, e := range entries {
			if jobs.Get([]byte(e.Name())) == nil {
				if err := os.RemoveAll(filepath.Join(s.dir, JobsDirName, e.Name())); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// idAlphabet is Crockford's base32 in lower case: no i, l, o, u, easy to read back and type.
const idAlphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// NewID returns a random 10-character job id (50 bits).
func NewID() (string, error) {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("new job id: %w", err)
	}
	for i := range b {
		b[i] = idAlphabet[b[i]&31]
	}
	return string(b[:]), nil
}

// ValidID reports whether id has the form of a job id, so that it can name a directory.
func ValidID(id string) bool {
	if len(id) != 10 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if strings.IndexByte(idAlphabet, id[i]) < 0 {
			return false
		}
	}
	return true
}

// ImageExt is the file extension a stored image gets from its content: .png, .jpg, .webp
// (.img for anything else).
func ImageExt(image []byte) string {
	switch http.DetectContentType(image) {
	case "image/png":
		return ".png"
	case "image/jpeg":
		return ".jpg"
	case "image/webp":
		return ".webp"
	}
	return ".img"
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

// Create stores a new job in JOB_STATE_QUEUED: its directory with the input image and the
// spec (defaults filled in by the caller), then its record.
func (s *Store) Create(spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, error) {
	job, _, err := s.create(spec, image, ClientRequest{})
	return job, err
}

// JobForRequest returns the job that client request req.ID created, in its current state;
// ErrNotFound when no stored job has that id, ErrRequestMismatch when the job was created
// from a request with another hash.
func (s *Store) JobForRequest(req ClientRequest) (*framepackv1.Job, error) {
	var job *framepackv1.Job
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		job, err = jobForRequest(tx, req)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("job for client request %q: %w", req.ID, err)
	}
	return job, nil
}

func jobForRequest(tx *bolt.Tx, req ClientRequest) (*framepackv1.Job, error) {
	id := tx.Bucket(bucketRequests).Get([]byte(req.ID))
	if id == nil {
		return nil, ErrNotFound
	}
	m, err := getMeta(tx, string(id))
	if err != nil {
		return nil, err
	}
	if m.Request.Hash != req.Hash {
		return nil, fmt.Errorf("%w (job %s)", ErrRequestMismatch, id)
	}
	return getJob(tx, string(id))
}

// CreateOnce is Create for a submission with a client request id (req.ID not empty): when a
// stored job was created by the same id it returns that job, in its current state, and false
// (ErrRequestMismatch when its hash differs); else it creates the job, records req with it and
// returns true. Concurrent calls with one id create one job.
func (s *Store) CreateOnce(req ClientRequest, spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, bool, error) {
	if req.ID == "" {
		return nil, false, errors.New("create job: empty client request id")
	}
	return s.create(spec, image, req)
}

// create writes a new job's directory and then, in one transaction, its record. With a client
// request id that a stored job already has, the transaction writes nothing: create removes the
// directory and returns that job and false (ErrRequestMismatch when its hash differs). bbolt runs
// one Update at a time, so of concurrent calls with one id only the first creates a job.
func (s *Store) create(spec *framepackv1.JobSpec, image []byte, req ClientRequest) (*framepackv1.Job, bool, error) {
	id, err := NewID()
	if err != nil {
		return nil, false, err
	}
	dir := s.JobDir(id)
	if err := os.Mkdir(dir.Path(), 0o755); err != nil {
		// A collision of 50 random bits, or a broken state dir: either way, say so.
		return nil, false, fmt.Errorf("create job %s: %w", id, err)
	}
	fail := func(err error) (*framepackv1.Job, bool, error) {
		_ = os.RemoveAll(dir.Path())
		return nil, false, fmt.Errorf("create job %s: %w", id, err)
	}
	var input string // a job that extends a video has no image
	if len(image) > 0 {
		input = "input" + ImageExt(image)
		if err := WriteFileAtomic(filepath.Join(dir.Path(), input), image); err != nil {
			return fail(err)
		}
	}
	spec, files := StoredSpec(spec)
	if err := files.Each(func(name string, data []byte) error { return WriteFileAtomic(filepath.Join(dir.Path(), name), data) }); err != nil {
		return fail(err)
	}
	specJSON, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(spec)
	if err != nil {
		return fail(err)
	}
	if err := WriteFileAtomic(dir.Spec(), append(specJSON, '\n')); err != nil {
		return fail(err)
	}
	for _, sub := range []string{dir.History(), dir.Videos()} {
		if err := os.Mkdir(sub, 0o755); err != nil {
			return fail(err)
		}
	}
	job := NewJob(id, spec, s.now())
	var stored *framepackv1.Job // the job a repeated client request id names
	err = s.db.Update(func(tx *bolt.Tx) error {
		if req.ID != "" && tx.Bucket(bucketRequests).Get([]byte(req.ID)) != nil {
			var err error
			if stored, err = jobForRequest(tx, req); err != nil {
				return fmt.Errorf("client request %q: %w", req.ID, err)
			}
			return nil
		}
		jobs := tx.Bucket(bucketJobs)
		if jobs.Get([]byte(id)) != nil {
			return fmt.Errorf("job id %s already in use", id)
		}
		seq, err := tx.Bucket(bucketOrder).NextSequence()
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucketOrder).Put(seqKey(seq), []byte(id)); err != nil {
			return err
		}
		if err := putMeta(tx, id, &meta{Seq: seq, Input: input, End: files.End, Keyframes: files.Keyframes, Video: files.Video, Request: req}); err != nil {
			return err
		}
		if req.ID != "" {
			if err := tx.Bucket(bucketRequests).Put([]byte(req.ID), []byte(id)); err != nil {
				return err
			}
		}
		return putJob(tx, job)
	})
	if err != nil {
		return fail(err)
	}
	if stored != nil {
		_ = os.RemoveAll(dir.Path())
		return stored, false, nil
	}
	return job, true, nil
}

// InputFiles are the files a job keeps beside its input image: the end image, the keyframe
// images (JobSpec.keyframes' order) and the input video, by file name.
type InputFiles struct {
	End       string
	Keyframes []string
	Video     string
	data      map[string][]byte
}

// Each calls fn with each file's name and bytes.
func (f InputFiles) Each(fn func(name string, data []byte) error) error {
	for _, name := range append(append([]string{f.End}, f.Keyframes...), f.Video) {
		if name == "" {
			continue
		}
		if err := fn(name, f.data[name]); err != nil {
			return err
		}
	}
	return nil
}

// StoredSpec returns spec as a store keeps it, and the files kept beside the input: the end
// image, the keyframe images and the input video are not in the stored spec, which names each
// by its SHA-256.
func StoredSpec(spec *framepackv1.JobSpec) (*framepackv1.JobSpec, InputFiles) {
	files := InputFiles{data: map[string][]byte{}}
	if len(spec.GetEndImage()) == 0 && len(spec.GetKeyframes()) == 0 && len(spec.GetInputVideo()) == 0 {
		return spec, files
	}
	spec = proto.Clone(spec).(*framepackv1.JobSpec)
	keep := func(name string, data []byte) string {
		files.data[name] = data
		sum := sha256.Sum256(data)
		return hex.EncodeToString(sum[:])
	}
	if e := spec.GetEndImage(); len(e) > 0 {
		files.End = "end" + ImageExt(e)
		spec.EndImage, spec.EndImageSha256 = nil, keep(files.End, e)
	}
	for i, k := range spec.GetKeyframes() {
		if len(k.GetImage()) == 0 {
			continue
		}
		name := fmt.Sprintf("keyframe-%02d%s", i, ImageExt(k.GetImage()))
		k.Image, k.ImageSha256 = nil, keep(name, k.GetImage())
		files.Keyframes = append(files.Keyframes, name)
	}
	if v := spec.GetInputVideo(); len(v) > 0 {
		files.Video = "input-video" + videoExt(v)
		spec.InputVideo, spec.InputVideoSha256 = nil, keep(files.Video, v)
	}
	return spec, files
}

// videoExt is a video's file extension from its first bytes: .mp4 (ISO base media, MOV
// included), .mkv (Matroska, WebM included), else .video.
func videoExt(v []byte) string {
	switch {
	case len(v) >= 8 && string(v[4:8]) == "ftyp":
		return ".mp4"
	case len(v) >= 4 && string(v[:4]) == "\x1a\x45\xdf\xa3":
		return ".mkv"
	}
	return ".video"
}

// NewJob is a new job's record in JOB_STATE_QUEUED, created now.
func NewJob(id string, spec *framepackv1.JobSpec, now time.Time) *framepackv1.Job {
	ts := timestamppb.New(now)
	return &framepackv1.Job{Id: id, State: framepackv1.JobState_JOB_STATE_QUEUED, Spec: spec, CreateTime: ts, UpdateTime: ts}
}

// WriteFileAtomic writes name through name.partial, synced, then renamed into place.
func WriteFileAtomic(name string, data []byte) error {
	tmp := name + ".partial"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, name)
}

func putJob(tx *bolt.Tx, job *framepackv1.Job) error {
	b, err := proto.Marshal(job)
	if err != nil {
		return fmt.Errorf("marshal job %s: %w", job.GetId(), err)
	}
	return tx.Bucket(bucketJobs).Put([]byte(job.GetId()), b)
}

func getJob(tx *bolt.Tx, id string) (*framepackv1.Job, error) {
	b := tx.Bucket(bucketJobs).Get([]byte(id))
	if b == nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	job := &framepackv1.Job{}
	if err := proto.Unmarshal(b, job); err != nil {
		return nil, fmt.Errorf("unmarshal job %s: %w", id, err)
	}
	return job, nil
}

func putMeta(tx *bolt.Tx, id string, m *meta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("marshal job meta %s: %w", id, err)
	}
	return tx.Bucket(bucketMeta).Put([]byte(id), b)
}

func getMeta(tx *bolt.Tx, id string) (*meta, error) {
	b := tx.Bucket(bucketMeta).Get([]byte(id))
	if b == nil {
		return nil, fmt.Errorf("%w: %q (no meta)", ErrNotFound, id)
	}
	m := &meta{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("unmarshal job meta %s: %w", id, err)
	}
	return m, nil
}

// Get returns job id; ErrNotFound if the store does not know it.
func (s *Store) Get(id string) (*framepackv1.Job, error) {
	var job *framepackv1.Job
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		job, err = getJob(tx, id)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get job: %w", err)
	}
	return job, nil
}

// viewMeta reads job id's meta in a read-only transaction.
func (s *Store) viewMeta(id string) (*meta, error) {
	var m *meta
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		m, err = getMeta(tx, id)
		return err
	})
	return m, err
}

// InputPath returns the path of job id's input image ("" for a job that extends a video).
func (s *Store) InputPath(id string) (string, error) {
	m, err := s.viewMeta(id)
	if err != nil {
		return "", fmt.Errorf("input of job: %w", err)
	}
	if m.Input == "" {
		return "", nil
	}
	return filepath.Join(s.JobDir(id).Path(), m.Input), nil
}

// ExtraInputs returns the paths of job id's keyframe images (JobSpec.keyframes' order) and of
// its input video ("" without one).
func (s *Store) ExtraInputs(id string) (keyframes []string, video string, err error) {
	m, err := s.viewMeta(id)
	if err != nil {
		return nil, "", fmt.Errorf("inputs of job: %w", err)
	}
	dir := s.JobDir(id).Path()
	for _, k := range m.Keyframes {
		keyframes = append(keyframes, filepath.Join(dir, k))
	}
	if m.Video != "" {
		video = filepath.Join(dir, m.Video)
	}
	return keyframes, video, nil
}

// EndImagePath returns the path of job id's end image, "" when the job has none.
func (s *Store) EndImagePath(id string) (string, error) {
	m, err := s.viewMeta(id)
	if err != nil {
		return "", fmt.Errorf("end image of job: %w", err)
	}
	if m.End == "" {
		return "", nil
	}
	return filepath.Join(s.JobDir(id).Path(), m.End), nil
}

// Update changes job id in one transaction: fn edits the job, which is stored with a new
// update_time unless fn returns an error. It returns the job as stored.
func (s *Store) Update(id string, fn func(*framepackv1.Job) error) (*framepackv1.Job, error) {
	var job *framepackv1.Job
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		if job, err = getJob(tx, id); err != nil {
			return err
		}
		if err := fn(job); err != nil {
			return err
		}
		job.UpdateTime = timestamppb.New(s.now())
		return putJob(tx, job)
	})
	if err != nil {
		return nil, fmt.Errorf("update job %s: %w", id, err)
	}
	return job, nil
}

// markStarted records the first time job id started, once, and returns it.
func (s *Store) markStarted(id string) (time.Time, error) {
	var first time.Time
	err := s.db.Update(func(tx *bolt.Tx) error {
		m, err := getMeta(tx, id)
		if err != nil {
			return err
		}
		if m.FirstStart.IsZero() {
			m.FirstStart = s.now()
			if err := putMeta(tx, id, m); err != nil {
				return err
			}
		}
		first = m.FirstStart
		return nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("mark job %s started: %w", id, err)
	}
	return first, nil
}

// ListOptions selects a page of jobs.
type ListOptions struct {
	// States keeps only jobs in these states; empty keeps all.
	States []framepackv1.JobState
	// PageSize is the most jobs returned; 0 means 50, at most 1000.
	PageSize int
	// PageToken continues after the previous page; empty for the first page.
	PageToken string
}

// Page size limits of List.
const (
	DefaultPageSize = 50
	MaxPageSize     = 1000
)

// List returns jobs newest first, a page at a time, and the token of the next page (empty
// after the last).
func (s *Store) List(opts ListOptions) ([]*framepackv1.Job, string, error) {
	size := opts.PageSize
	if size <= 0 {
		size = DefaultPageSize
	}
	size = min(size, MaxPageSize)
	var start uint64
	if opts.PageToken != "" {
		v, err := strconv.ParseUint(opts.PageToken, 10, 64)
		if err != nil || v == 0 {
			return nil, "", fmt.Errorf("list jobs: %w", ErrBadPageToken)
		}
		start = v
	}
	var jobs []*framepackv1.Job
	next := ""
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketOrder).Cursor()
		var k, v []byte
		if start == 0 {
			k, v = c.Last()
		} else {
			// The token is the seq of the last job returned: continue below it.
			k, v = c.Seek(seqKey(start))
			if k == nil {
				k, v = c.Last()
			}
			for k != nil && binary.BigEndian.Uint64(k) >= start {
				k, v = c.Prev()
			}
		}
		var lastSeq uint64
		for ; k != nil; k, v = c.Prev() {
			job, err := getJob(tx, string(v))
			if err != nil {
				return err
			}
			if len(opts.States) > 0 && !slices.Contains(opts.States, job.GetState()) {
				continue
			}
			if len(jobs) == size {
				next = strconv.FormatUint(lastSeq, 10)
				return nil
			}
			jobs = append(jobs, job)
			lastSeq = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	return jobs, next, nil
}

// Unfinished returns the jobs that are queued or running, oldest first: the work to take up
// again after a restart.
func (s *Store) Unfinished() ([]*framepackv1.Job, error) {
	var jobs []*framepackv1.Job
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketOrder).ForEach(func(_, v []byte) error {
			job, err := getJob(tx, string(v))
			if err != nil {
				return err
			}
			switch job.GetState() {
			case framepackv1.JobState_JOB_STATE_QUEUED, framepackv1.JobState_JOB_STATE_RUNNING:
				jobs = append(jobs, job)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("unfinished jobs: %w", err)
	}
	return jobs, nil
}

// SaveCheckpoint records cp as job id's resume point. Every file it names must exist inside
// the job directory, so that a recorded checkpoint never points at missing data.
func (s *Store) SaveCheckpoint(id string, cp Checkpoint) error {
	dir := s.JobDir(id).Path()
	if cp.Sections <= 0 || cp.Section < 0 || cp.Section >= cp.Sections {
		return fmt.Errorf("save checkpoint of job %s: %w: section %d of %d", id, ErrBadCheckpoint, cp.Section, cp.Sections)
	}
	for name, rel := range cp.Files {
		if rel == "" || filepath.IsAbs(rel) || !filepath.IsLocal(rel) {
			return fmt.Errorf("save checkpoint of job %s: %w: file %s: %q is not a path inside the job directory", id, ErrBadCheckpoint, name, rel)
		}
		if _, err := os.Stat(filepath.Join(dir, rel)); err != nil {
			return fmt.Errorf("save checkpoint of job %s: %w: file %s: %w", id, ErrBadCheckpoint, name, err)
		}
	}
	if cp.VideoPath != "" {
		// A video so far may be made from its parts file when first read (video.Materialize).
		if _, err := os.Stat(cp.VideoPath); err != nil {
			if _, perr := os.Stat(video.PartsPath(cp.VideoPath)); perr != nil {
				return fmt.Errorf("save checkpoint of job %s: %w: video: %w", id, ErrBadCheckpoint, err)
			}
		}
	}
	cp.Time = s.now()
	cp.Files = copyMap(cp.Files)
	err := s.db.Update(func(tx *bolt.Tx) error {
		m, err := getMeta(tx, id)
		if err != nil {
			return err
		}
		m.Checkpoint = &cp
		return putMeta(tx, id, m)
	})
	if err != nil {
		return fmt.Errorf("save checkpoint of job %s: %w", id, err)
	}
	return nil
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Checkpoint returns job id's resume point, or nil when no section has finished.
func (s *Store) Checkpoint(id string) (*Checkpoint, error) {
	var cp *Checkpoint
	err := s.db.View(func(tx *bolt.Tx) error {
		m, err := getMeta(tx, id)
		if err != nil {
			return err
		}
		cp = m.Checkpoint
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint of job: %w", err)
	}
	return cp, nil
}

// AppendEvent stores ev as event seq of job id's event log.
func (s *Store) AppendEvent(id string, seq uint64, ev *framepackv1.JobEvent) error {
	b, err := proto.Marshal(ev)
	if err != nil {
		return fmt.Errorf("append event of job %s: %w", id, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketJobs).Get([]byte(id)) == nil {
			return fmt.Errorf("%w: %q", ErrNotFound, id)
		}
		log, err := tx.Bucket(bucketEvents).CreateBucketIfNotExists([]byte(id))
		if err != nil {
			return err
		}
		return log.Put(seqKey(seq), b)
	})
	if err != nil {
		return fmt.Errorf("append event of job %s: %w", id, err)
	}
	return nil
}

// Events returns job id's stored event log in order and the sequence number that follows
// its last event (0 for an empty log).
func (s *Store) Events(id string) ([]*framepackv1.JobEvent, uint64, error) {
	var evs []*framepackv1.JobEvent
	var next uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketJobs).Get([]byte(id)) == nil {
			return fmt.Errorf("%w: %q", ErrNotFound, id)
		}
		log := tx.Bucket(bucketEvents).Bucket([]byte(id))
		if log == nil {
			return nil
		}
		return log.ForEach(func(k, v []byte) error {
			ev := &framepackv1.JobEvent{}
			if err := proto.Unmarshal(v, ev); err != nil {
				return fmt.Errorf("event %x: %w", k, err)
			}
			evs = append(evs, ev)
			next = binary.BigEndian.Uint64(k) + 1
			return nil
		})
	})
	if err != nil {
		return nil, 0, fmt.Errorf("events of job %s: %w", id, err)
	}
	return evs, next, nil
}

// RemovePartials removes every "*.partial" file or directory under job id's directory, what
// an interrupted writer leaves; complete outputs are only ever renamed into place.
func (s *Store) RemovePartials(id string) ([]string, error) {
	removed, err := RemovePartialFiles(s.JobDir(id).Path())
	if err != nil {
		return removed, fmt.Errorf("remove partial files of job %s: %w", id, err)
	}
	return removed, nil
}

// RemovePartialFiles removes every "*.partial" file or directory under root.
func RemovePartialFiles(root string) ([]string, error) {
	var partial []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if strings.HasSuffix(d.Name(), ".partial") {
			partial = append(partial, path)
			if d.IsDir() {
				return filepath.SkipDir
			}
		}
		return nil
	})
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, p := range partial {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	return partial, errors.Join(errs...)
}
