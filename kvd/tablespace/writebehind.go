package tablespace

import (
	"sync"
	"sync/atomic"
)

// WriteBehind writes blocks to a Tablespace off the caller's path: Enqueue
// copies the block into a pooled buffer and hands it to a worker through a
// bounded queue, never blocking; a full queue drops the block (counted).
type WriteBehind struct {
	ts    *Tablespace
	q     chan wbItem
	mu    sync.RWMutex // guards closed against Enqueue's send
	close bool
	wg    sync.WaitGroup
	pool  sync.Pool

	enqueued, written, dropped, failed atomic.Uint64
}

type wbItem struct {
	buf  *[]byte // key then value
	klen int
}

// WriteBehindStats are the queue's counters.
type WriteBehindStats struct {
	Enqueued, Written, Dropped, Failed uint64
	Queued                             int
}

// NewWriteBehind starts the worker; queueLen bounds the blocks in flight.
func NewWriteBehind(ts *Tablespace, queueLen int) *WriteBehind {
	w := &WriteBehind{ts: ts, q: make(chan wbItem, max(queueLen, 1))}
	w.wg.Add(1)
	go w.run()
	return w
}

// Enqueue schedules Put(key, value) and reports whether it was queued; the
// caller may reuse key and value at once.
func (w *WriteBehind) Enqueue(key, value []byte) bool {
	if checkKey(key) != nil || len(value) > w.ts.MaxValueBytes() {
		w.dropped.Add(1)
		return false
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.close || len(w.q) == cap(w.q) { // full: drop before copying the block
		w.dropped.Add(1)
		return false
	}
	bp, _ := w.pool.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, 0, len(key)+len(value))
		bp = &b
	}
	*bp = append(append((*bp)[:0], key...), value...)
	select {
	case w.q <- wbItem{buf: bp, klen: len(key)}:
		w.enqueued.Add(1)
		return true
	default: // filled up since the check
		w.pool.Put(bp)
		w.dropped.Add(1)
		return false
	}
}

func (w *WriteBehind) run() {
	defer w.wg.Done()
	for it := range w.q {
		b := *it.buf
		if err := w.ts.Put(b[:it.klen], b[it.klen:]); err != nil {
			w.failed.Add(1)
			w.ts.log.Warn().Err(err).Msg("tablespace write-behind put failed")
		} else {
			w.written.Add(1)
		}
		w.pool.Put(it.buf)
	}
}

// Stats returns the counters.
func (w *WriteBehind) Stats() WriteBehindStats {
	return WriteBehindStats{Enqueued: w.enqueued.Load(), Written: w.written.Load(),
		Dropped: w.dropped.Load(), Failed: w.failed.Load(), Queued: len(w.q)}
}

// Close stops accepting blocks, writes the queued ones and stops the
// worker. Close the WriteBehind before its Tablespace.
func (w *WriteBehind) Close() {
	w.mu.Lock()
	if w.close {
		w.mu.Unlock()
		return
	}
	w.close = true
	close(w.q)
	w.mu.Unlock()
	w.wg.Wait()
}
