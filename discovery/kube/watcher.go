package kube

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
)

// errRelist ends a watch so that the watcher lists again.
var errRelist = errors.New("kube: relist")

type podList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []pod `json:"items"`
}

type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// Watcher lists and watches Pods by label selector and publishes the fleet.
type Watcher struct {
	cli      *Client
	ns, sel  string
	log      zerolog.Logger
	onChange func(*discovery.Snapshot)
	pods     map[string]PodRecord
	snap     atomic.Pointer[discovery.Snapshot]
	synced   chan struct{}
	rv       string
}

// NewWatcher returns a watcher of the Pods matching selector in namespace.
func NewWatcher(cli *Client, namespace, selector string, log zerolog.Logger, onChange func(*discovery.Snapshot)) *Watcher {
	w := &Watcher{cli: cli, ns: namespace, sel: selector, log: log, onChange: onChange,
		pods: map[string]PodRecord{}, synced: make(chan struct{})}
	w.snap.Store(&discovery.Snapshot{})
	return w
}

// Snapshot returns the current fleet.
func (w *Watcher) Snapshot() *discovery.Snapshot { return w.snap.Load() }

// Synced is closed after the first successful list.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Run lists then watches until ctx ends; an ERROR event, 410 Gone or a
// disconnect leads to a fresh list, which drops Pods absent from it.
func (w *Watcher) Run(ctx context.Context) error {
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := w.list(ctx)
		if err == nil {
			delay = 100 * time.Millisecond
			err = w.watch(ctx)
		}
		if ctx.Err() != nil {
			break
		}
		if err != nil && !errors.Is(err, errRelist) {
			w.log.Warn().Err(err).Msg("kube: pod watch")
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			delay = min(delay*2, 5*time.Second)
		}
	}
	return nil
}

func (w *Watcher) podsPath() string {
	return "/api/v1/namespaces/" + url.PathEscape(w.ns) + "/pods?labelSelector=" + url.QueryEscape(w.sel)
}

func (w *Watcher) list(ctx context.Context) error {
	resp, err := w.cli.do(ctx, http.MethodGet, w.podsPath(), "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var l podList
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return fmt.Errorf("kube: decode pod list: %w", err)
	}
	pods := make(map[string]PodRecord, len(l.Items))
	for i := range l.Items {
		pr, err := l.Items[i].record()
		if err != nil {
			continue
		}
		w.note(pr)
		pods[pr.Name] = pr
	}
	w.pods = pods
	w.rv = l.Metadata.ResourceVersion
	w.publish()
	select {
	case <-w.synced:
	default:
		close(w.synced)
	}
	return nil
}

func (w *Watcher) note(pr PodRecord) {
	if pr.Err != nil {
		w.log.Warn().Err(pr.Err).Str("pod", pr.Name).Msg("kube: invalid worker annotation")
	}
}

func (w *Watcher) watch(ctx context.Context) error {
	path := w.podsPath() + "&watch=true&allowWatchBookmarks=true&timeoutSeconds=300&resourceVersion=" + url.QueryEscape(w.rv)
	resp, err := w.cli.do(ctx, http.MethodGet, path, "", nil)
	if err != nil {
		var se *StatusError
		if errors.As(err, &se) && se.Code == http.StatusGone {
			return errRelist
		}
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), MaxPodBytes+4096)
	for sc.Scan() {
		var ev watchEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("kube: decode watch event: %w", err)
		}
		switch ev.Type {
		case "ADDED", "MODIFIED", "DELETED", "BOOKMARK":
		default: // ERROR (410 Gone among others) or unknown
			return errRelist
		}
		var p pod
		if err := json.Unmarshal(ev.Object, &p); err != nil {
			return fmt.Errorf("kube: decode watch object: %w", err)
		}
		if p.Metadata.ResourceVersion != "" {
			w.rv = p.Metadata.ResourceVersion
		}
		if ev.Type == "BOOKMARK" {
			continue
		}
		pr, err := p.record()
		if err != nil {
			continue
		}
		old, had := w.pods[pr.Name]
		if ev.Type == "DELETED" {
			pr.State = PodAbsent
		}
		w.note(pr)
		if pr.State == PodAbsent {
			if !had {
				continue
			}
			delete(w.pods, pr.Name)
		} else {
			if had && old.State == pr.State && recordEqual(old.Record, pr.Record) {
				continue
			}
			w.pods[pr.Name] = pr
		}
		w.publish()
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("kube: read watch: %w", err)
	}
	return errRelist
}

func recordEqual(a, b discovery.Record) bool {
	x, err1 := a.Encode()
	y, err2 := b.Encode()
	return err1 == nil && err2 == nil && string(x) == string(y)
}

// publish builds a snapshot from the tracked Pods: one record per worker id
// (the Pod whose name sorts first wins), sorted by worker id.
func (w *Watcher) publish() {
	names := make([]string, 0, len(w.pods))
	for n, pr := range w.pods {
		if pr.State != PodAbsent {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	seen := make(map[string]bool, len(names))
	ws := make([]discovery.Record, 0, len(names))
	for _, n := range names {
		r := w.pods[n].Record
		if seen[r.WorkerID] {
			continue
		}
		seen[r.WorkerID] = true
		ws = append(ws, r)
	}
	slices.SortFunc(ws, func(a, b discovery.Record) int { return strings.Compare(a.WorkerID, b.WorkerID) })
	rev, _ := strconv.ParseInt(w.rv, 10, 64)
	s := &discovery.Snapshot{Revision: rev, Workers: ws}
	w.snap.Store(s)
	if w.onChange != nil {
		w.onChange(s)
	}
}
