package discovery

// Test-only access to the watcher's and registrar's internals, for the
// external test package (which can import etcdtest; this package cannot).

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SetWatcherHooks installs hooks; call before Run.
func SetWatcherHooks(w *Watcher, beforeList func(n int), afterList func(n int, rev int64)) {
	w.hooks.beforeList, w.hooks.afterList = beforeList, afterList
}

// SetWatcherResumeHook installs a hook that runs before a watch resumes
// from rev+1 without a list; call before Run.
func SetWatcherResumeHook(w *Watcher, beforeResume func(rev int64)) {
	w.hooks.beforeResume = beforeResume
}

// Sessions returns how many list-or-resume attempts the watcher has started.
func Sessions(w *Watcher) int64 { return w.sessions.Load() }

// CloseWatch closes the running watch stream; false when none is open.
func CloseWatch(w *Watcher) bool { return w.closeWatch() }

// Lists returns how many lists the watcher has started.
func Lists(w *Watcher) int64 { return w.lists.Load() }

// RegistrarStale reports whether the registrar considers its lease lost.
func RegistrarStale(r *Registrar) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stale
}

// RegistrarInterval returns the effective keepalive interval.
func RegistrarInterval(r *Registrar) (ttl, interval int64) {
	return int64(r.ttl), int64(r.interval)
}

// SetProbeInterval changes how often a watcher checks that etcd is
// reachable, and bounds each list by the same time.
func SetProbeInterval(w *Watcher, d time.Duration) { w.probeInterval, w.listTimeout = d, d }

// SetStallInterval changes how often a watcher's watchdog asks its watch
// stream for progress (and so how soon it gives up a silent one).
func SetStallInterval(w *Watcher, d time.Duration) { w.stallInterval = d }

// GetMember reads key through cli and returns the address of the member
// the client sent the read to, as a registrar notes its calls.
func GetMember(ctx context.Context, cli *clientv3.Client, key string) (string, error) {
	ctx, p := withMemberNote(ctx)
	_, err := cli.Get(ctx, key)
	return memberOf(p), err
}
