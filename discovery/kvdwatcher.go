package discovery

import (
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// KVDSnapshot is the kvd registry as of one etcd revision; like Snapshot it
// is never modified after publication.
type KVDSnapshot struct {
	Revision int64
	// KVDs holds the valid records, sorted by Peer, one per key.
	KVDs []KVDRecord
	// byHost maps each host to the index of its kvd in KVDs (the first by
	// Peer when a host registered more than one).
	byHost map[string]int
}

// NewKVDSnapshot returns the snapshot of kvds (sorted in place) at rev,
// as KVDWatcher publishes them.
func NewKVDSnapshot(rev int64, kvds []KVDRecord) *KVDSnapshot {
	slices.SortFunc(kvds, func(a, b KVDRecord) int { return strings.Compare(a.Peer, b.Peer) })
	s := &KVDSnapshot{Revision: rev, KVDs: kvds, byHost: make(map[string]int, len(kvds))}
	for i, k := range kvds {
		if _, ok := s.byHost[k.Host]; !ok {
			s.byHost[k.Host] = i
		}
	}
	return s
}

// ByHost returns the kvd registered for host (as HostOf returns it: an
// IPv6 literal without brackets). A nil snapshot has none.
func (s *KVDSnapshot) ByHost(host string) (KVDRecord, bool) {
	if s == nil {
		return KVDRecord{}, false
	}
	i, ok := s.byHost[host]
	if !ok {
		return KVDRecord{}, false
	}
	return s.KVDs[i], true
}

// Len returns the number of kvds.
func (s *KVDSnapshot) Len() int { return len(s.KVDs) }

// KVDWatcher keeps an immutable view of the kvd records under one prefix,
// listed and watched exactly as the worker fleet is (watchLoop). Invalid
// records are logged once per revision and left out.
type KVDWatcher struct {
	watchLoop
	onChange func(*KVDSnapshot)
	snap     atomic.Pointer[KVDSnapshot]
	// recs maps each valid key to its record. Owned by the Run goroutine.
	recs map[string]KVDRecord
}

// NewKVDWatcher returns a watcher of the kvd registry under prefix.
// onChange (optional) is called on the Run goroutine after each new
// snapshot is published; it must return quickly.
func NewKVDWatcher(cli *clientv3.Client, prefix string, log zerolog.Logger, onChange func(*KVDSnapshot)) *KVDWatcher {
	w := &KVDWatcher{onChange: onChange, recs: map[string]KVDRecord{}}
	w.watchLoop = newWatchLoop(cli, prefix, log.With().Str("component", "discovery_kvd_watcher").Str("prefix", prefix).Logger(), "kvd registry", "kvds", "ignoring invalid kvd record", w)
	w.snap.Store(NewKVDSnapshot(0, nil))
	return w
}

// Snapshot returns the latest published view; never nil.
func (w *KVDWatcher) Snapshot() *KVDSnapshot { return w.snap.Load() }

func (w *KVDWatcher) size() int                     { return len(w.Snapshot().KVDs) }
func (w *KVDWatcher) nextExpiry() (time.Time, bool) { return time.Time{}, false }
func (w *KVDWatcher) expireHeld(time.Time)          {}
func (w *KVDWatcher) holdRemovals(bool, time.Time)  {}

func (w *KVDWatcher) rebuild(kvs []*mvccpb.KeyValue, rev int64, n int) {
	recs := make(map[string]KVDRecord, len(kvs))
	invalid := make(map[string]int64)
	for _, kv := range kvs {
		key := string(kv.Key)
		rec, err := w.decode(key, kv.Value)
		if err != nil {
			w.reportInvalid(key, kv.ModRevision, err)
			invalid[key] = kv.ModRevision
			continue
		}
		recs[key] = rec
	}
	w.recs, w.invalid = recs, invalid
	msg := "etcd kvd registry listed"
	if n > 1 {
		msg = "etcd kvd registry re-listed"
	}
	w.log.Info().Int64("revision", rev).Int("kvds", len(recs)).Int("invalid", len(invalid)).Msg(msg)
	w.publish(rev)
}

func (w *KVDWatcher) apply(events []*clientv3.Event, rev int64) {
	changed := false
	for _, ev := range events {
		key := string(ev.Kv.Key)
		if ev.Type == clientv3.EventTypeDelete {
			delete(w.invalid, key)
			if _, ok := w.recs[key]; ok {
				delete(w.recs, key)
				changed = true
			}
			continue
		}
		rec, err := w.decode(key, ev.Kv.Value)
		if err != nil {
			w.reportInvalid(key, ev.Kv.ModRevision, err)
			w.invalid[key] = ev.Kv.ModRevision
			// The kvd's last valid record no longer describes it.
			if _, ok := w.recs[key]; ok {
				delete(w.recs, key)
				changed = true
			}
			continue
		}
		delete(w.invalid, key)
		w.recs[key] = rec
		changed = true
	}
	if changed {
		w.publish(rev)
	}
}

func (w *KVDWatcher) decode(key string, value []byte) (KVDRecord, error) {
	return decodeKeyed[KVDRecord](w.prefix, key, value, MaxKVDRecordBytes, ErrInvalidKVDRecord)
}

func (w *KVDWatcher) publish(rev int64) {
	kvds := make([]KVDRecord, 0, len(w.recs))
	for _, r := range w.recs {
		kvds = append(kvds, r)
	}
	s := NewKVDSnapshot(rev, kvds)
	w.snap.Store(s)
	w.markSynced()
	if w.onChange != nil {
		w.onChange(s)
	}
}
