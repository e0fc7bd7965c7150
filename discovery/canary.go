package discovery

import (
	"encoding/json"
	"slices"
	"sync"
)

// CanaryCheck applies the reference's tokenizer canary rule to fleet
// snapshots: a worker record's "kv" block may carry tokenizer_canary, the
// token ids its engine's tokenizer gives a fixed text. The first worker of a
// model seen with a canary sets the model's reference; a later worker of the
// same model whose canary differs is rejected — left out of the snapshot the
// router sees — and counted (Rejections, the reference's canary_rejections).
// Workers without a kv block or without a canary are not checked. When no
// worker of a model remains, its reference is forgotten, so that an operator
// recovers from a misconfiguration by replacing every worker.
//
// Within one snapshot (records sorted by worker id) the first in that order
// sets a reference; across snapshots the reference is the earliest seen, as
// the reference's watcher keeps it in event order.
//
// Safe for concurrent use; Filter is called from the watcher's goroutine.
type CanaryCheck struct {
	mu       sync.Mutex
	refs     map[string]canaryRef // by model
	rejected map[string]string    // worker id → the canary it was rejected with (counted once)
	count    uint64
	onReject func(rec *Record, firstWorker string)
}

type canaryRef struct {
	canary string // the canary's JSON, compacted
	worker string
}

// NewCanaryCheck returns a check; onReject (optional) is called once per
// rejected record, for the log line.
func NewCanaryCheck(onReject func(rec *Record, firstWorker string)) *CanaryCheck {
	return &CanaryCheck{refs: map[string]canaryRef{}, rejected: map[string]string{}, onReject: onReject}
}

// Rejections returns how many worker records were rejected.
func (c *CanaryCheck) Rejections() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count
}

// canaryOf returns a record's tokenizer canary, compacted, or "".
func canaryOf(rec *Record) string {
	if len(rec.KV) == 0 {
		return ""
	}
	var kv struct {
		Canary []int64 `json:"tokenizer_canary"`
	}
	if json.Unmarshal(rec.KV, &kv) != nil || len(kv.Canary) == 0 {
		return ""
	}
	b, _ := json.Marshal(kv.Canary) // []int64 always encodes
	return string(b)
}

// Filter returns snap without the workers whose canary differs from their
// model's reference (snap itself when none does).
func (c *CanaryCheck) Filter(snap *Snapshot) *Snapshot {
	if snap == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	models := make(map[string]bool, len(c.refs))
	for i := range snap.Workers {
		models[snap.Workers[i].ModelName] = true
	}
	for m := range c.refs {
		if !models[m] {
			delete(c.refs, m)
		}
	}
	// The reference must stay with a worker still present: if it left but
	// others of the model remain, the reference stands (the reference's
	// rule: it is forgotten only when no worker of the model remains).
	var drop []int
	seen := make(map[string]bool, len(snap.Workers))
	for i := range snap.Workers {
		rec := &snap.Workers[i]
		seen[rec.WorkerID] = true
		can := canaryOf(rec)
		if can == "" {
			continue
		}
		ref, ok := c.refs[rec.ModelName]
		if !ok {
			c.refs[rec.ModelName] = canaryRef{canary: can, worker: rec.WorkerID}
			continue
		}
		if ref.canary == can {
			delete(c.rejected, rec.WorkerID)
			continue
		}
		drop = append(drop, i)
		if c.rejected[rec.WorkerID] != can {
			c.rejected[rec.WorkerID] = can
			c.count++
			if c.onReject != nil {
				c.onReject(rec, ref.worker)
			}
		}
	}
	for id := range c.rejected {
		if !seen[id] {
			delete(c.rejected, id)
		}
	}
	if len(drop) == 0 {
		return snap
	}
	out := &Snapshot{Revision: snap.Revision, Workers: make([]Record, 0, len(snap.Workers)-len(drop))}
	for i := range snap.Workers {
		if _, bad := slices.BinarySearch(drop, i); !bad {
			out.Workers = append(out.Workers, snap.Workers[i])
		}
	}
	return out
}
