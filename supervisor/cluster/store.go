package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/video"
)

// record is a job as the cluster's KV bucket keeps it (key job.<id>).
type record struct {
	// Job is the binary framepack.v1.Job; its video paths are relative to the job directory,
	// so that each daemon reports them in its own working copy.
	Job   []byte `json:"job"`
	Seq   uint64 `json:"seq"`
	Input string `json:"input"`
	End   string `json:"end,omitempty"`
	// Keyframes and Video are the keyframe images' and the input video's objects (jobs.Store's
	// meta).
	Keyframes  []string  `json:"keyframes,omitempty"`
	Video      string    `json:"video,omitempty"`
	FirstStart time.Time `json:"first_start,omitzero"`
	// Checkpoint is the resume point; its VideoPath is relative to the job directory.
	Checkpoint *jobs.Checkpoint   `json:"checkpoint,omitempty"`
	Request    jobs.ClientRequest `json:"request,omitzero"`
	// Owner is the token of the daemon's lease that runs (or last ran) the job.
	Owner string `json:"owner,omitempty"`
}

const (
	jobKeyPrefix = "job."
	reqKeyPrefix = "req."
	seqKey       = "seq"
)

func jobKey(id string) string { return jobKeyPrefix + id }

// reqKey is the key of a client request id: its SHA-256, since ids may hold any character.
func reqKey(clientID string) string {
	sum := sha256.Sum256([]byte(clientID))
	return reqKeyPrefix + hex.EncodeToString(sum[:])
}

// Store is the cluster's job store (api.ClusterStore): job records in the KV bucket, their files
// in the object store, working copies in this daemon's state directory.
type Store struct {
	cfg    Config
	log    logrus.FieldLogger
	kv     jetstream.KeyValue
	obs    jetstream.ObjectStore
	lock   *os.File
	events *Events

	// mu protects leases: job id → the owner token of this daemon's lease on it.
	mu     sync.Mutex
	leases map[string]string
}

var _ api.ClusterStore = (*Store)(nil)

func opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

// StateDir returns this daemon's state directory.
func (s *Store) StateDir() string { return s.cfg.StateDir }

// JobDir returns job id's working copy on this daemon.
func (s *Store) JobDir(id string) jobs.Dir {
	return jobs.Dir(filepath.Join(s.cfg.StateDir, jobs.JobsDirName, id))
}

// Close releases the state directory.
func (s *Store) Close() error { return s.lock.Close() }

// objectName is the object of a file at rel (slash-separated) in job id's directory.
func objectName(id, rel string) string { return id + "/" + filepath.ToSlash(rel) }

// relPath returns p relative to job id's directory: p inside this daemon's copy, or inside any
// daemon's (…/jobs/<id>/…); p itself when it is already relative or names no job file.
func (s *Store) relPath(id, p string) string {
	if p == "" || !filepath.IsAbs(p) {
		return p
	}
	if rel, err := filepath.Rel(s.JobDir(id).Path(), p); err == nil && filepath.IsLocal(rel) {
		return filepath.ToSlash(rel)
	}
	mark := string(filepath.Separator) + jobs.JobsDirName + string(filepath.Separator) + id + string(filepath.Separator)
	if i := strings.LastIndex(p, mark); i >= 0 {
		return filepath.ToSlash(p[i+len(mark):])
	}
	return p
}

// localPath is relPath's inverse on this daemon.
func (s *Store) localPath(id, rel string) string {
	if rel == "" || filepath.IsAbs(rel) {
		return rel
	}
	return filepath.Join(s.JobDir(id).Path(), filepath.FromSlash(rel))
}

// decode returns a record's job with its video paths in this daemon's working copy.
func (s *Store) decode(rec *record) (*framepackv1.Job, error) {
	job := &framepackv1.Job{}
	if err := proto.Unmarshal(rec.Job, job); err != nil {
		return nil, fmt.Errorf("unmarshal job: %w", err)
	}
	if r := job.GetResult(); r != nil {
		r.VideoPath = s.localPath(job.GetId(), r.GetVideoPath())
	}
	if p := job.GetProgress(); p != nil {
		p.LatestVideoPath = s.localPath(job.GetId(), p.GetLatestVideoPath())
	}
	return job, nil
}

// encode stores job into rec with its video paths relative to the job directory.
func (s *Store) encode(rec *record, job *framepackv1.Job) error {
	job = proto.Clone(job).(*framepackv1.Job)
	if r := job.GetResult(); r != nil {
		r.VideoPath = s.relPath(job.GetId(), r.GetVideoPath())
	}
	if p := job.GetProgress(); p != nil {
		p.LatestVideoPath = s.relPath(job.GetId(), p.GetLatestVideoPath())
	}
	b, err := proto.Marshal(job)
	if err != nil {
		return fmt.Errorf("marshal job %s: %w", job.GetId(), err)
	}
	rec.Job = b
	return nil
}

// load reads job id's record and its revision.
func (s *Store) load(ctx context.Context, id string) (*record, uint64, error) {
	e, err := s.kv.Get(ctx, jobKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w: %q", jobs.ErrNotFound, id)
	}
	if err != nil {
		return nil, 0, err
	}
	rec := &record{}
	if err := json.Unmarshal(e.Value(), rec); err != nil {
		return nil, 0, fmt.Errorf("job %s: bad record: %w", id, err)
	}
	return rec, e.Revision(), nil
}

// errRetry marks a compare-and-set that lost a race; change retries it.
var errRetry = errors.New("cluster: record changed meanwhile")

// maxCASTries bounds how often change retries a compare-and-set that lost a race.
const maxCASTries = 50

// change applies fn to job id's record as one compare-and-set, retried while another daemon
// changed the record meanwhile. With owned set, the record must still be owned by this
// daemon's lease on the job (jobs.ErrLeaseLost otherwise).
func (s *Store) change(id string, owned bool, fn func(rec *record) error) (*record, error) {
	ctx, cancel := opContext()
	defer cancel()
	for range maxCASTries {
		rec, rev, err := s.load(ctx, id)
		if err != nil {
			return nil, err
		}
		if owned {
			if err := s.checkOwner(id, rec); err != nil {
				return nil, err
			}
		}
		if err := fn(rec); err != nil {
			return nil, err
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		if _, err := s.kv.Update(ctx, jobKey(id), b, rev); err != nil {
			if isWrongRevision(err) {
				continue
			}
			return nil, err
		}
		return rec, nil
	}
	return nil, fmt.Errorf("job %s: %w %d times", id, errRetry, maxCASTries)
}

func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// checkOwner fails with jobs.ErrLeaseLost when this daemon holds a lease on job id that the
// record no longer names. Writes by a daemon that holds no lease (a cancel through the API)
// are not fenced.
func (s *Store) checkOwner(id string, rec *record) error {
	s.mu.Lock()
	token, held := s.leases[id]
	s.mu.Unlock()
	if held && rec.Owner != token {
		return fmt.Errorf("job %s: %w (owner now %q)", id, jobs.ErrLeaseLost, rec.Owner)
	}
	return nil
}

// nextSeq returns the cluster's next submission sequence number.
func (s *Store) nextSeq(ctx context.Context) (uint64, error) {
	for range maxCASTries {
		e, err := s.kv.Get(ctx, seqKey)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if _, err := s.kv.Create(ctx, seqKey, []byte("1")); err == nil {
				return 1, nil
			} else if !isWrongRevision(err) {
				return 0, err
			}
			continue
		}
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseUint(string(e.Value()), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("sequence key: %w", err)
		}
		if _, err := s.kv.Update(ctx, seqKey, []byte(strconv.FormatUint(n+1, 10)), e.Revision()); err == nil {
			return n + 1, nil
		} else if !isWrongRevision(err) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("sequence key: %w %d times", errRetry, maxCASTries)
}

// Create stores a new job: its images in the object store, then its record.
func (s *Store) Create(spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, error) {
	job, _, err := s.create(spec, image, jobs.ClientRequest{})
	return job, err
}

// CreateOnce is Create for a submission with a client request id; concurrent calls with one
// id, through any daemons, create one job (jobs.Store.CreateOnce).
func (s *Store) CreateOnce(req jobs.ClientRequest, spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, bool, error) {
	if req.ID == "" {
		return nil, false, errors.New("create job: empty client request id")
	}
	return s.create(spec, image, req)
}

func (s *Store) create(spec *framepackv1.JobSpec, image []byte, req jobs.ClientRequest) (*framepackv1.Job, bool, error) {
	ctx, cancel := opContext()
	defer cancel()
	if req.ID != "" {
		if job, err := s.JobForRequest(req); err == nil || !errors.Is(err, jobs.ErrNotFound) {
			return job, false, err
		}
	}
	id, err := jobs.NewID()
	if err != nil {
		return nil, false, err
	}
	fail := func(err error) (*framepackv1.Job, bool, error) {
		s.removeObjects(ctx, id)
		return nil, false, fmt.Errorf("create job %s: %w", id, err)
	}
	spec, files := jobs.StoredSpec(spec)
	rec := &record{Request: req, End: files.End, Keyframes: files.Keyframes, Video: files.Video}
	if len(image) > 0 { // a job that extends a video has no image
		rec.Input = "input" + jobs.ImageExt(image)
		if _, err := s.obs.PutBytes(ctx, objectName(id, rec.Input), image); err != nil {
			return fail(fmt.Errorf("store input image: %w", err))
		}
	}
	if err := files.Each(func(name string, data []byte) error {
		if _, err := s.obs.PutBytes(ctx, objectName(id, name), data); err != nil {
			return fmt.Errorf("store %s: %w", name, err)
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	if rec.Seq, err = s.nextSeq(ctx); err != nil {
		return fail(err)
	}
	job := jobs.NewJob(id, spec, s.cfg.Now())
	if err := s.encode(rec, job); err != nil {
		return fail(err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fail(err)
	}
	if _, err := s.kv.Create(ctx, jobKey(id), b); err != nil {
		return fail(err)
	}
	if req.ID != "" {
		if _, err := s.kv.Create(ctx, reqKey(req.ID), []byte(id)); err != nil {
			// Another submission with this id got there first: that job is the answer.
			_ = s.kv.Purge(ctx, jobKey(id))
			s.removeObjects(ctx, id)
			if !isWrongRevision(err) {
				return nil, false, fmt.Errorf("create job %s: client request %q: %w", id, req.ID, err)
			}
			job, err := s.JobForRequest(req)
			return job, false, err
		}
	}
	return job, true, nil
}

// JobForRequest returns the job client request req.ID created (jobs.Store.JobForRequest).
func (s *Store) JobForRequest(req jobs.ClientRequest) (*framepackv1.Job, error) {
	ctx, cancel := opContext()
	defer cancel()
	e, err := s.kv.Get(ctx, reqKey(req.ID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("job for client request %q: %w", req.ID, jobs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("job for client request %q: %w", req.ID, err)
	}
	id := string(e.Value())
	rec, _, err := s.load(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("job for client request %q: %w", req.ID, err)
	}
	if rec.Request.Hash != req.Hash {
		return nil, fmt.Errorf("job for client request %q: %w (job %s)", req.ID, jobs.ErrRequestMismatch, id)
	}
	return s.decode(rec)
}

// Get returns job id.
func (s *Store) Get(id string) (*framepackv1.Job, error) {
	ctx, cancel := opContext()
	defer cancel()
	rec, _, err := s.load(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("get job: %w", err)
	}
	return s.decode(rec)
}

// Update changes job id in one compare-and-set (jobs.Store.Update); a daemon whose lease on
// the job was lost gets jobs.ErrLeaseLost.
func (s *Store) Update(id string, fn func(*framepackv1.Job) error) (*framepackv1.Job, error) {
	var job *framepackv1.Job
	_, err := s.change(id, true, func(rec *record) error {
		j, err := s.decode(rec)
		if err != nil {
			return err
		}
		if err := fn(j); err != nil {
			return err
		}
		if s.holds(id) && j.GetLane() != "" && !strings.Contains(j.GetLane(), "/") {
			j.Lane = s.cfg.Node + "/" + j.GetLane() // in a cluster a lane is named with its daemon's
		}
		j.UpdateTime = timestampNow(s.cfg.Now())
		job = j
		return s.encode(rec, j)
	})
	if err != nil {
		return nil, fmt.Errorf("update job %s: %w", id, err)
	}
	return job, nil
}

// all returns every job record, in submission order.
func (s *Store) all(ctx context.Context) ([]*record, error) {
	lister, err := s.kv.ListKeysFiltered(ctx, jobKeyPrefix+"*")
	if err != nil {
		return nil, err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	var out []*record
	for _, k := range keys {
		rec, _, err := s.load(ctx, strings.TrimPrefix(k, jobKeyPrefix))
		if errors.Is(err, jobs.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b *record) int {
		switch {
		case a.Seq < b.Seq:
			return -1
		case a.Seq > b.Seq:
			return 1
		}
		return 0
	})
	return out, nil
}

// List returns the cluster's jobs newest first, a page at a time (jobs.Store.List).
func (s *Store) List(opts jobs.ListOptions) ([]*framepackv1.Job, string, error) {
	size := opts.PageSize
	if size <= 0 {
		size = jobs.DefaultPageSize
	}
	size = min(size, jobs.MaxPageSize)
	var before uint64
	if opts.PageToken != "" {
		v, err := strconv.ParseUint(opts.PageToken, 10, 64)
		if err != nil || v == 0 {
			return nil, "", fmt.Errorf("list jobs: %w", jobs.ErrBadPageToken)
		}
		before = v
	}
	ctx, cancel := opContext()
	defer cancel()
	recs, err := s.all(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	var out []*framepackv1.Job
	var last uint64
	for i := len(recs) - 1; i >= 0; i-- {
		rec := recs[i]
		if before != 0 && rec.Seq >= before {
			continue
		}
		job, err := s.decode(rec)
		if err != nil {
			return nil, "", fmt.Errorf("list jobs: %w", err)
		}
		if len(opts.States) > 0 && !slices.Contains(opts.States, job.GetState()) {
			continue
		}
		if len(out) == size {
			return out, strconv.FormatUint(last, 10), nil
		}
		out = append(out, job)
		last = rec.Seq
	}
	return out, "", nil
}

// Unfinished returns the queued and running jobs of the cluster, oldest first.
func (s *Store) Unfinished() ([]*framepackv1.Job, error) {
	ctx, cancel := opContext()
	defer cancel()
	recs, err := s.all(ctx)
	if err != nil {
		return nil, fmt.Errorf("unfinished jobs: %w", err)
	}
	var out []*framepackv1.Job
	for _, rec := range recs {
		job, err := s.decode(rec)
		if err != nil {
			return nil, err
		}
		if !jobs.Finished(job.GetState()) {
			out = append(out, job)
		}
	}
	return out, nil
}

// Prepare records job id's first start, fetches its images and its last checkpoint's files
// into this daemon's working copy and returns them (jobs.Backend). Files already there with
// the same content are kept.
func (s *Store) Prepare(id string) (jobs.Prepared, error) {
	rec, err := s.change(id, true, func(rec *record) error {
		if rec.FirstStart.IsZero() {
			rec.FirstStart = s.cfg.Now()
		}
		return nil
	})
	if err != nil {
		return jobs.Prepared{}, fmt.Errorf("prepare job %s: %w", id, err)
	}
	dir := s.JobDir(id)
	for _, sub := range []string{dir.History(), dir.Videos()} {
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return jobs.Prepared{}, fmt.Errorf("prepare job %s: %w", id, err)
		}
	}
	ctx, cancel := opContext()
	defer cancel()
	p := jobs.Prepared{Dir: dir, FirstStart: rec.FirstStart}
	if rec.Input != "" {
		p.InputPath = s.localPath(id, rec.Input)
		if err := s.fetch(ctx, id, rec.Input); err != nil {
			return jobs.Prepared{}, fmt.Errorf("prepare job %s: input image: %w", id, err)
		}
	}
	if rec.End != "" {
		p.EndImagePath = s.localPath(id, rec.End)
		if err := s.fetch(ctx, id, rec.End); err != nil {
			return jobs.Prepared{}, fmt.Errorf("prepare job %s: end image: %w", id, err)
		}
	}
	for _, k := range rec.Keyframes {
		p.KeyframePaths = append(p.KeyframePaths, s.localPath(id, k))
		if err := s.fetch(ctx, id, k); err != nil {
			return jobs.Prepared{}, fmt.Errorf("prepare job %s: keyframe %s: %w", id, k, err)
		}
	}
	if rec.Video != "" {
		p.VideoPath = s.localPath(id, rec.Video)
		if err := s.fetch(ctx, id, rec.Video); err != nil {
			return jobs.Prepared{}, fmt.Errorf("prepare job %s: input video: %w", id, err)
		}
	}
	if cp := rec.Checkpoint; cp != nil {
		err := s.fetchCheckpoint(ctx, id, cp)
		switch {
		case errors.Is(err, jetstream.ErrObjectNotFound):
			s.log.WithField("job", id).WithError(err).Warn("checkpoint files missing from the cluster; the job starts from scratch")
		case err != nil:
			return jobs.Prepared{}, fmt.Errorf("prepare job %s: checkpoint: %w", id, err)
		default:
			c := *cp
			c.VideoPath = s.localPath(id, cp.VideoPath)
			p.Resume = &c
		}
	}
	return p, nil
}

// fetchCheckpoint fetches a checkpoint's files and video.
func (s *Store) fetchCheckpoint(ctx context.Context, id string, cp *jobs.Checkpoint) error {
	rels := make([]string, 0, len(cp.Files)+1)
	for _, rel := range cp.Files {
		rels = append(rels, rel)
	}
	if cp.VideoPath != "" {
		videos, err := s.objectsUnder(ctx, id, cp.VideoPath)
		if errors.Is(err, jetstream.ErrObjectNotFound) && slices.Contains(rels, filepath.ToSlash(video.PartsPath(cp.VideoPath))) {
			videos, err = nil, nil // a video so far not joined yet: its parts and segments are among the files
		}
		if err != nil {
			return err
		}
		rels = append(rels, videos...)
	}
	for _, rel := range rels {
		if err := s.fetch(ctx, id, rel); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
	return nil
}

// objectsUnder returns the files a video path stands for, relative to the job directory: the
// MP4 and its settings file, or the files of a PNG frames directory.
func (s *Store) objectsUnder(ctx context.Context, id, rel string) ([]string, error) {
	infos, err := s.obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	base := objectName(id, rel)
	stem := strings.TrimSuffix(base, path.Ext(base))
	var out []string
	for _, o := range infos {
		if o.Name == base || o.Name == stem+".json" || strings.HasPrefix(o.Name, base+"/") {
			out = append(out, strings.TrimPrefix(o.Name, id+"/"))
		}
	}
	if !slices.Contains(out, filepath.ToSlash(rel)) && !slices.ContainsFunc(out, func(o string) bool { return strings.HasPrefix(o, filepath.ToSlash(rel)+"/") }) {
		return nil, fmt.Errorf("video %s: %w", rel, jetstream.ErrObjectNotFound)
	}
	return out, nil
}

// fetch copies object rel of job id into its place in this daemon's working copy, unless the
// file there already has the object's content.
func (s *Store) fetch(ctx context.Context, id, rel string) error {
	local := s.localPath(id, rel)
	info, err := s.obs.GetInfo(ctx, objectName(id, rel))
	if err != nil {
		return err
	}
	if d, err := fileDigest(local); err == nil && d == info.Digest {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
		return err
	}
	tmp := local + ".partial"
	if err := s.obs.GetFile(ctx, objectName(id, rel), tmp); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, local)
}

// fileDigest returns a file's SHA-256 as the object store writes digests.
func fileDigest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "SHA-256=" + base64.URLEncoding.EncodeToString(h.Sum(nil)), nil
}

// put copies the file at rel of job id's working copy into the object store, unless the
// object already has its content.
func (s *Store) put(ctx context.Context, id, rel string) error {
	local := s.localPath(id, rel)
	d, err := fileDigest(local)
	if err != nil {
		return err
	}
	if info, err := s.obs.GetInfo(ctx, objectName(id, rel)); err == nil && info.Digest == d {
		return nil
	}
	f, err := os.Open(local)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = s.obs.Put(ctx, jetstream.ObjectMeta{Name: objectName(id, rel)}, f)
	return err
}

// checkpointFiles lists what a checkpoint holds, relative to the job directory: its files and
// its video (with the video's settings file, or each file of a PNG frames directory).
func (s *Store) checkpointFiles(id string, cp *jobs.Checkpoint) ([]string, error) {
	var out []string
	for _, rel := range cp.Files {
		out = append(out, filepath.ToSlash(rel))
	}
	if cp.VideoPath == "" {
		return out, nil
	}
	v := s.localPath(id, s.relPath(id, cp.VideoPath))
	st, err := os.Stat(v)
	if errors.Is(err, os.ErrNotExist) && fileExists(video.PartsPath(v)) {
		// A video so far not joined yet: its parts file and segments are in cp.Files.
		if settings := strings.TrimSuffix(v, filepath.Ext(v)) + ".json"; fileExists(settings) {
			out = append(out, s.relPath(id, settings))
		}
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		err := filepath.WalkDir(v, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				out = append(out, s.relPath(id, p))
			}
			return err
		})
		return out, err
	}
	out = append(out, s.relPath(id, v))
	if settings := strings.TrimSuffix(v, filepath.Ext(v)) + ".json"; fileExists(settings) {
		out = append(out, s.relPath(id, settings))
	}
	return out, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// SaveCheckpoint copies the checkpoint's files and video into the object store, then records
// it (fenced: a daemon whose lease was lost records nothing), then removes the objects of the
// checkpoint before it that this one does not hold.
func (s *Store) SaveCheckpoint(id string, cp jobs.Checkpoint) error {
	if cp.Sections <= 0 || cp.Section < 0 || cp.Section >= cp.Sections {
		return fmt.Errorf("save checkpoint of job %s: %w: section %d of %d", id, jobs.ErrBadCheckpoint, cp.Section, cp.Sections)
	}
	for name, rel := range cp.Files {
		if rel == "" || filepath.IsAbs(rel) || !filepath.IsLocal(rel) {
			return fmt.Errorf("save checkpoint of job %s: %w: file %s: %q is not a path inside the job directory", id, jobs.ErrBadCheckpoint, name, rel)
		}
	}
	if cp.VideoPath != "" && filepath.IsAbs(s.relPath(id, cp.VideoPath)) {
		return fmt.Errorf("save checkpoint of job %s: %w: video %s is outside the job directory", id, jobs.ErrBadCheckpoint, cp.VideoPath)
	}
	files, err := s.checkpointFiles(id, &cp)
	if err != nil {
		return fmt.Errorf("save checkpoint of job %s: %w: %w", id, jobs.ErrBadCheckpoint, err)
	}
	ctx, cancel := opContext()
	defer cancel()
	for _, rel := range files {
		if err := s.put(ctx, id, rel); err != nil {
			return fmt.Errorf("save checkpoint of job %s: store %s: %w", id, rel, err)
		}
	}
	stored := cp
	stored.Time = s.cfg.Now()
	stored.VideoPath = s.relPath(id, cp.VideoPath)
	stored.Files = maps(cp.Files)
	var prev *jobs.Checkpoint
	if _, err := s.change(id, true, func(rec *record) error {
		prev = rec.Checkpoint
		rec.Checkpoint = &stored
		return nil
	}); err != nil {
		return fmt.Errorf("save checkpoint of job %s: %w", id, err)
	}
	if prev != nil {
		s.removeStale(ctx, id, prev, files)
	}
	return nil
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = filepath.ToSlash(v)
	}
	return out
}

// removeStale removes the objects of checkpoint prev that keep does not list.
func (s *Store) removeStale(ctx context.Context, id string, prev *jobs.Checkpoint, keep []string) {
	old := make([]string, 0, len(prev.Files)+2)
	for _, rel := range prev.Files {
		old = append(old, rel)
	}
	if prev.VideoPath != "" {
		if under, err := s.objectsUnder(ctx, id, prev.VideoPath); err == nil {
			old = append(old, under...)
		}
	}
	for _, rel := range old {
		if slices.Contains(keep, rel) {
			continue
		}
		if err := s.obs.Delete(ctx, objectName(id, rel)); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			s.log.WithField("job", id).WithError(err).Warn("remove a superseded checkpoint file from the cluster")
		}
	}
}

// Checkpoint returns job id's resume point (its paths relative to the job directory), nil when
// no section has finished.
func (s *Store) Checkpoint(id string) (*jobs.Checkpoint, error) {
	ctx, cancel := opContext()
	defer cancel()
	rec, _, err := s.load(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("checkpoint of job: %w", err)
	}
	return rec.Checkpoint, nil
}

// RemovePartials removes what an interrupted writer left in job id's working copy.
func (s *Store) RemovePartials(id string) ([]string, error) {
	removed, err := jobs.RemovePartialFiles(s.JobDir(id).Path())
	if err != nil {
		return removed, fmt.Errorf("remove partial files of job %s: %w", id, err)
	}
	return removed, nil
}

// OpenVideo opens a video of job id, fetching it from the cluster into this daemon's working
// copy when another daemon wrote it.
func (s *Store) OpenVideo(id, p string) (*os.File, error) {
	rel := s.relPath(id, p)
	if filepath.IsAbs(rel) || !filepath.IsLocal(filepath.FromSlash(rel)) {
		return nil, fmt.Errorf("video %s is outside the job directory", p)
	}
	local := s.localPath(id, rel)
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		return os.Open(local) // PNG frames: the API says so
	}
	ctx, cancel := opContext()
	defer cancel()
	err := s.fetch(ctx, id, rel)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		if f, lerr := os.Open(local); lerr == nil {
			return f, nil // written here, superseded in the cluster since
		}
		return nil, fmt.Errorf("video %s of job %s: %w", rel, id, os.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("fetch video %s of job %s: %w", rel, id, err)
	}
	return os.Open(local)
}

// objectBytes returns the bytes of each job's objects.
func (s *Store) objectBytes(ctx context.Context) (map[string]int64, error) {
	infos, err := s.obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, o := range infos {
		id, _, _ := strings.Cut(o.Name, "/")
		out[id] += int64(o.Size)
	}
	return out, nil
}

// UsedBytes returns what the cluster's object store holds for all jobs.
func (s *Store) UsedBytes() (int64, error) {
	ctx, cancel := opContext()
	defer cancel()
	per, err := s.objectBytes(ctx)
	if err != nil {
		return 0, fmt.Errorf("cluster files: %w", err)
	}
	var n int64
	for _, b := range per {
		n += b
	}
	return n, nil
}

// PendingBytes is what the cluster's unfinished jobs will still write (estimate less what they
// hold).
func (s *Store) PendingBytes(estimate func(*framepackv1.JobSpec) int64) (int64, error) {
	unfinished, err := s.Unfinished()
	if err != nil {
		return 0, err
	}
	ctx, cancel := opContext()
	defer cancel()
	per, err := s.objectBytes(ctx)
	if err != nil {
		return 0, fmt.Errorf("cluster files: %w", err)
	}
	var n int64
	for _, job := range unfinished {
		n += max(0, estimate(job.GetSpec())-per[job.GetId()])
	}
	return n, nil
}

// Delete removes finished job id from the cluster: its record, files, events and this
// daemon's working copy (other daemons' copies go with their retention).
func (s *Store) Delete(id string) (int64, error) {
	ctx, cancel := opContext()
	defer cancel()
	rec, _, err := s.load(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("delete job %s: %w", id, err)
	}
	job, err := s.decode(rec)
	if err != nil {
		return 0, fmt.Errorf("delete job %s: %w", id, err)
	}
	if !jobs.Finished(job.GetState()) {
		return 0, fmt.Errorf("delete job %s: %w: it is %s; cancel it first", id, jobs.ErrNotFinished,
			strings.ToLower(strings.TrimPrefix(job.GetState().String(), "JOB_STATE_")))
	}
	per, _ := s.objectBytes(ctx)
	if err := s.kv.Purge(ctx, jobKey(id)); err != nil {
		return 0, fmt.Errorf("delete job %s: %w", id, err)
	}
	if rec.Request.ID != "" {
		_ = s.kv.Purge(ctx, reqKey(rec.Request.ID))
	}
	s.removeObjects(ctx, id)
	if s.events != nil {
		s.events.purge(ctx, id)
	}
	local, _ := jobs.DirBytes(s.JobDir(id).Path())
	if err := os.RemoveAll(s.JobDir(id).Path()); err != nil {
		return 0, fmt.Errorf("delete job %s: %w", id, err)
	}
	return max(per[id], local), nil
}

// removeObjects removes every object of job id.
func (s *Store) removeObjects(ctx context.Context, id string) {
	infos, err := s.obs.List(ctx)
	if err != nil {
		return
	}
	for _, o := range infos {
		if strings.HasPrefix(o.Name, id+"/") {
			if err := s.obs.Delete(ctx, o.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
				s.log.WithField("job", id).WithError(err).Warn("remove a job file from the cluster")
			}
		}
	}
}

// Sweep deletes the finished jobs the retention policy does not keep, counting the bytes the
// cluster's object store holds for each. Every daemon sweeps; a job another daemon deleted
// first is skipped.
func (s *Store) Sweep(r jobs.Retention) ([]string, error) {
	if !r.Enabled() {
		return nil, nil
	}
	ctx, cancel := opContext()
	defer cancel()
	recs, err := s.all(ctx)
	if err != nil {
		return nil, fmt.Errorf("retention sweep: %w", err)
	}
	per, err := s.objectBytes(ctx)
	if err != nil {
		return nil, fmt.Errorf("retention sweep: %w", err)
	}
	var entries []jobs.RetentionEntry
	for _, rec := range recs {
		job, err := s.decode(rec)
		if err != nil {
			return nil, fmt.Errorf("retention sweep: %w", err)
		}
		entries = append(entries, jobs.RetentionEntry{ID: job.GetId(), Updated: job.GetUpdateTime().AsTime(), Bytes: per[job.GetId()], Finished: jobs.Finished(job.GetState())})
	}
	var removed []string
	var errs []error
	for _, id := range r.Victims(entries, s.cfg.Now()) {
		if _, err := s.Delete(id); err != nil {
			if !errors.Is(err, jobs.ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// claim makes this daemon's lease (token) the owner of job id. ok is false when the job
// has ended or is gone: nothing to run.
func (s *Store) claim(id, token string) (ok bool, err error) {
	_, err = s.change(id, false, func(rec *record) error {
		job, err := s.decode(rec)
		if err != nil {
			return err
		}
		if jobs.Finished(job.GetState()) {
			return errFinished
		}
		rec.Owner = token
		return nil
	})
	if errors.Is(err, errFinished) || errors.Is(err, jobs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	s.leases[id] = token
	s.mu.Unlock()
	return true, nil
}

var errFinished = errors.New("cluster: job has ended")

// holds reports whether this daemon holds a lease on job id.
func (s *Store) holds(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.leases[id]
	return ok
}

// unlease forgets this daemon's lease on job id (given back or done), if token is still it.
func (s *Store) unlease(id, token string) {
	s.mu.Lock()
	if s.leases[id] == token {
		delete(s.leases, id)
	}
	s.mu.Unlock()
}
