// Package cluster makes framepackd daemons one cluster sharing one queue, built on NATS
// JetStream (framepackd --cluster nats://…). Nothing here is a protocol of our own: the
// cluster is a set of JetStream resources that every daemon opens (creating them if missing):
//
//	stream <P>_QUEUE    work-queue stream, one message per queued job (its id), consumed by
//	                    one durable pull consumer that all daemons share: a daemon fetches a
//	                    message only when one of its lanes is free, keeps it (ack "in
//	                    progress" every AckWait/3) while the job runs, acknowledges it when the
//	                    job ends and gives it back (nak) when it stops early; a daemon that
//	                    dies stops renewing it and JetStream redelivers it after AckWait.
//	KV <p>-jobs         one record per job (the framepack.v1.Job, its checkpoint, its owner):
//	                    every change is a compare-and-set on the key's revision.
//	object <p>-files    the job's files by path in its directory: the input image, the end
//	                    image, the checkpoint's files and the newest section's video.
//	stream <P>_EVENTS   each job's durable events (subject <p>.events.<id>): a watcher on any
//	                    daemon replays them and follows the live ones through one ordered
//	                    consumer.
//	stream <P>_LIVE     the newest preview and memory telemetry of each job (one per subject).
//
// A job runs in a working copy of its directory on the daemon that took it (<state>/jobs/<id>,
// the layout of a single host): before it starts, its inputs and last checkpoint come from the
// object store, and every checkpoint goes to the object store before it is recorded. A daemon
// that takes over a job resumes it from those files, byte for byte as a restarted single-host
// daemon does.
//
// The owner of a running job is fenced: taking a job writes a new owner token into its record
// (a compare-and-set), and every write of the run (progress, checkpoint, the end) checks the
// token, so a daemon presumed dead that comes back cannot record anything for a job another
// daemon has taken over; it sees its lease lost (a KV watch of the record) and stops the run.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
)

// Defaults of Config.
const (
	// DefaultPrefix names the cluster's JetStream resources.
	DefaultPrefix = "framepack"
	// DefaultAckWait is how long a daemon may go without renewing its hold on a running job
	// before JetStream hands the job to another daemon.
	DefaultAckWait = 30 * time.Second
	// DefaultReplicas is the replica count of the streams, bucket and object store.
	DefaultReplicas = 1
)

// takeWait is how long one Take waits for a job.
const takeWait = 2 * time.Second

// opTimeout bounds one JetStream call.
const opTimeout = 30 * time.Second

// Config says how a daemon joins a cluster.
type Config struct {
	// URL is the NATS server list, nats://host:4222[,nats://…]; required.
	URL string
	// Node names this daemon in the cluster (in job owner tokens and logs); empty means the
	// host name and process id.
	Node string
	// StateDir is this daemon's state directory, for the working copies of the jobs it runs
	// and the videos it serves; required. One daemon holds it at a time.
	StateDir string
	// Prefix names the JetStream resources (several clusters may share a NATS server);
	// empty means DefaultPrefix. Letters, digits, '-' and '_' only.
	Prefix string
	// AckWait is DefaultAckWait when 0; see DefaultAckWait.
	AckWait time.Duration
	// Replicas is DefaultReplicas when 0: the copies JetStream keeps of each resource (3 on
	// a NATS cluster of 3 servers, so that losing one loses nothing).
	Replicas int
	// Options are extra NATS connection options (credentials, TLS).
	Options []nats.Option
	// Observe, when set, sees every job event this daemon publishes (metrics).
	Observe func(*framepackv1.JobEvent)
	// Log is the cluster's logger; nil discards.
	Log logrus.FieldLogger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Cluster is this daemon's membership of a cluster: the NATS connection and the shared
// store, queue and events (api.Cluster).
type Cluster struct {
	cfg    Config
	log    logrus.FieldLogger
	nc     *nats.Conn
	js     jetstream.JetStream
	store  *Store
	queue  *Queue
	events *Events
}

var _ api.Cluster = (*Cluster)(nil)

// names are the cluster's JetStream resource names.
type names struct {
	queueStream, queueSubject, consumer string
	jobsBucket, filesBucket             string
	eventsStream, eventsSubject         string // eventsSubject + "." + id
	liveStream, liveSubject             string // liveSubject + "." + id + "." + kind
}

func namesFor(prefix string) names {
	up := strings.ToUpper(strings.ReplaceAll(prefix, "-", "_"))
	return names{
		queueStream: up + "_QUEUE", queueSubject: prefix + ".queue", consumer: "runners",
		jobsBucket: prefix + "-jobs", filesBucket: prefix + "-files",
		eventsStream: up + "_EVENTS", eventsSubject: prefix + ".events",
		liveStream: up + "_LIVE", liveSubject: prefix + ".live",
	}
}

func validPrefix(p string) bool {
	if p == "" {
		return false
	}
	for _, r := range p {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Join connects to the cluster's NATS servers, opens (or creates) its JetStream resources and
// locks the state directory. Close leaves the cluster.
func Join(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.URL == "" || cfg.StateDir == "" {
		return nil, errors.New("join cluster: URL and StateDir are required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if !validPrefix(cfg.Prefix) {
		return nil, fmt.Errorf("join cluster: prefix %q: letters, digits, '-' and '_' only", cfg.Prefix)
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = DefaultAckWait
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = DefaultReplicas
	}
	if cfg.Node == "" {
		host, _ := os.Hostname()
		cfg.Node = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = l
	}
	log = log.WithField("node", cfg.Node)
	lock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("join cluster: %w", err)
	}
	defer func() {
		if err != nil {
			_ = lock.Close()
		}
	}()
	opts := append([]nats.Option{
		nats.Name("framepackd " + cfg.Node),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil when the connection is closed on purpose
				log.WithError(err).Warn("disconnected from the cluster's NATS server; reconnecting")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.WithField("server", nc.ConnectedUrl()).Info("reconnected to the cluster") }),
	}, cfg.Options...)
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("join cluster: connect to %s: %w", cfg.URL, err)
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("join cluster: %w", err)
	}
	n := namesFor(cfg.Prefix)
	res, err := openResources(ctx, js, n, cfg)
	if err != nil {
		return nil, fmt.Errorf("join cluster at %s: %w", cfg.URL, err)
	}
	c := &Cluster{cfg: cfg, log: log, nc: nc, js: js}
	c.store = &Store{cfg: cfg, log: log, kv: res.kv, obs: res.obs, lock: lock, leases: map[string]string{}}
	c.queue = &Queue{cfg: cfg, log: log, js: js, names: n, cons: res.cons, store: c.store}
	c.events = &Events{cfg: cfg, log: log, js: js, names: n, store: c.store, streams: map[*eventStream]struct{}{}}
	c.store.events = c.events
	log.WithFields(logrus.Fields{"url": cfg.URL, "prefix": cfg.Prefix, "ack_wait": cfg.AckWait}).Info("joined the cluster")
	return c, nil
}

// resources are the JetStream handles a cluster uses.
type resources struct {
	cons jetstream.Consumer
	kv   jetstream.KeyValue
	obs  jetstream.ObjectStore
}

func openResources(ctx context.Context, js jetstream.JetStream, n names, cfg Config) (resources, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	var r resources
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: n.queueStream, Subjects: []string{n.queueSubject}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Replicas: cfg.Replicas, Description: "framepackd: queued jobs (one message per job id)",
	}); err != nil {
		return r, fmt.Errorf("queue stream %s: %w", n.queueStream, err)
	}
	var err error
	if r.cons, err = js.CreateOrUpdateConsumer(ctx, n.queueStream, jetstream.ConsumerConfig{
		Durable: n.consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.AckWait, MaxDeliver: -1,
		MaxAckPending: -1, Description: "framepackd: the daemons taking jobs",
	}); err != nil {
		return r, fmt.Errorf("queue consumer: %w", err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: n.eventsStream, Subjects: []string{n.eventsSubject + ".*"}, Storage: jetstream.FileStorage,
		Replicas: cfg.Replicas, Description: "framepackd: job events",
	}); err != nil {
		return r, fmt.Errorf("events stream %s: %w", n.eventsStream, err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: n.liveStream, Subjects: []string{n.liveSubject + ".*.*"}, Storage: jetstream.MemoryStorage,
		MaxMsgsPerSubject: 1, MaxAge: time.Hour, Replicas: cfg.Replicas,
		Description: "framepackd: newest preview and memory telemetry of each job",
	}); err != nil {
		return r, fmt.Errorf("live stream %s: %w", n.liveStream, err)
	}
	if r.kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: n.jobsBucket, History: 1, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		Description: "framepackd: job records",
	}); err != nil {
		return r, fmt.Errorf("job bucket %s: %w", n.jobsBucket, err)
	}
	if r.obs, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: n.filesBucket, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		Description: "framepackd: job inputs, checkpoints and videos",
	}); err != nil {
		return r, fmt.Errorf("file store %s: %w", n.filesBucket, err)
	}
	return r, nil
}

// Store returns the cluster's job store.
func (c *Cluster) Store() api.ClusterStore { return c.store }

// Queue returns the cluster's shared job queue.
func (c *Cluster) Queue() jobs.SharedQueue { return c.queue }

// Events returns the cluster's job events.
func (c *Cluster) Events() api.Events { return c.events }

// Node returns this daemon's name in the cluster.
func (c *Cluster) Node() string { return c.cfg.Node }

// Close leaves the cluster: the leases still held are given back (a daemon stopping at once
// leaves them to expire), the NATS connection is drained and the state directory unlocked.
func (c *Cluster) Close() error {
	c.queue.releaseAll()
	c.events.Close()
	err := c.nc.Drain()
	_ = c.store.Close()
	if err != nil {
		return fmt.Errorf("leave cluster: %w", err)
	}
	return nil
}

// lockStateDir takes the state directory's lock file, as the single host's bbolt store does:
// one daemon per state directory.
func lockStateDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Join(dir, jobs.JobsDirName), 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "cluster.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("state directory %s: %w", dir, jobs.ErrLocked)
	}
	return f, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
