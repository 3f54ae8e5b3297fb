package metrics

import (
	"fmt"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
)

// Lister lists jobs a page at a time (jobs.Store, a cluster's store).
type Lister interface {
	List(opts jobs.ListOptions) ([]*framepackv1.Job, string, error)
}

// CountJobs counts the jobs of a store by state (Config.Jobs), a page of jobs.MaxPageSize at a
// time.
func CountJobs(s Lister) (map[framepackv1.JobState]int, error) {
	counts := map[framepackv1.JobState]int{}
	token := ""
	for {
		list, next, err := s.List(jobs.ListOptions{PageSize: jobs.MaxPageSize, PageToken: token})
		if err != nil {
			return nil, fmt.Errorf("count jobs: %w", err)
		}
		for _, j := range list {
			counts[j.GetState()]++
		}
		if next == "" {
			return counts, nil
		}
		token = next
	}
}
