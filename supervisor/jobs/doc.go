// Package jobs is the supervisor's job store and queue.
//
// The store keeps every job in an embedded bbolt database (go.etcd.io/bbolt) in the state
// directory, <state>/jobs.db, and one directory per job beside it (<state>/jobs/<id>/: the
// input image, spec.json, history/ and video/). bbolt rather than SQLite through a pure-Go
// driver because what the supervisor needs is a handful of keyed records and an ordered index
// (jobs by id, submission order, per-job event logs, resume points), each change one
// serialisable, fsynced transaction: a B+tree key/value store does exactly that in one small
// dependency with no cgo, no SQL schema or migrations, and no query planner to reason about.
// Its single-writer file lock doubles as the guard against two daemons sharing one state
// directory (Open fails with ErrLocked). Jobs are stored as binary framepack.v1.Job messages,
// so the API returns what was stored; the store's own bookkeeping (submission sequence, input
// file name, first start, the resume Checkpoint) is JSON.
//
// The queue runs jobs first in, first out, one at a time per lane, through a Runner — the seam
// to the FramePack section loop (supervisor/pipeline). A Runner gets the job's spec, files and
// resume point, emits JobEvents while it works, records a Checkpoint after every finished
// section and returns the final video; see Runner for the contract. Jobs that were RUNNING when
// the daemon stopped are queued again at the next start and resume after their last
// checkpointed section.
//
// The package knows nothing of FramePack's arithmetic: what it needs of it is handed in
// (Config.Sections for a job's section count, an estimate function for Store.PendingBytes),
// and the specs it stores already carry every default (api.WithDefaults).
package jobs
