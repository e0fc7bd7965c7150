package discovery

import (
	"slices"
	"strings"
)

// Snapshot is the fleet as of one etcd revision. It is never modified after
// publication: the watcher applies changes to a copy and publishes a new
// Snapshot, so readers may keep and share one without locking. Callers must
// not modify Workers or the records in it.
type Snapshot struct {
	// Revision is the etcd revision this view reflects (0 before the first list).
	Revision int64
	// Workers holds the valid records, sorted by WorkerID, at most one per id.
	Workers []Record
}

// Get returns the record of one worker.
func (s *Snapshot) Get(workerID string) (Record, bool) {
	i, ok := s.find(workerID)
	if !ok {
		return Record{}, false
	}
	return s.Workers[i], true
}

// Len returns the number of workers.
func (s *Snapshot) Len() int { return len(s.Workers) }

func (s *Snapshot) find(workerID string) (int, bool) {
	return slices.BinarySearchFunc(s.Workers, workerID, func(r Record, id string) int {
		return strings.Compare(r.WorkerID, id)
	})
}

func sortWorkers(ws []Record) {
	slices.SortFunc(ws, func(a, b Record) int { return strings.Compare(a.WorkerID, b.WorkerID) })
}
