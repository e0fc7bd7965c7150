package kvd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// TestBatchZeroCopyRoundTrip: a batched zero-copy set larger than one
// pipelined chunk, read back with one batch get copied out of the arena;
// refused leases inside a batch are reported per item and leave the
// connection usable.
func TestBatchZeroCopyRoundTrip(t *testing.T) {
	const n, size = 600, 1000
	d := startDaemon(t, daemonOpts{arenaBytes: int64(n+10) * 1024, storeOpt: func(o *StoreOptions) { o.SlotBytes = 1024 }})
	c := dial(t, d, ClientOptions{SharedArena: true})
	keys, vals := make([][]byte, n), make([][]byte, n)
	for i := range keys {
		keys[i], vals[i] = key(i), value(i, size-i%7)
	}
	var sr BatchSetResult
	if err := c.BatchSetZeroCopy(ns, keys, vals, SetOptions{Retention: "long"}, &sr); err != nil {
		t.Fatal(err)
	}
	for i, ok := range sr.Accepted {
		if !ok {
			t.Fatalf("item %d refused: %q", i, sr.Reasons[i])
		}
	}
	var r BatchResult
	ask := append(append([][]byte{}, keys...), key(100000)) // and a miss
	if err := c.BatchGetInto(ns, ask, &r); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if !r.Found[i] || !bytes.Equal(r.Values[i], vals[i]) || r.Retentions[i] != RetentionLong {
			t.Fatalf("item %d: found %v ret %v equal %v", i, r.Found[i], r.Retentions[i], bytes.Equal(r.Values[i], vals[i]))
		}
	}
	if r.Found[n] {
		t.Fatal("a missing key was found")
	}
	// Buffers are reused: a second call fills the same backing arrays.
	first := &r.Values[0][0]
	if err := c.BatchGetInto(ns, keys[:1], &r); err != nil || &r.Values[0][0] != first {
		t.Fatal("BatchGetInto did not reuse the value buffer", err)
	}
	// The allocating BatchGet agrees.
	vs, err := c.BatchGet(ns, ask[n-2:])
	if err != nil || !bytes.Equal(vs[0], vals[n-2]) || !bytes.Equal(vs[1], vals[n-1]) || vs[2] != nil {
		t.Fatal("BatchGet disagrees", err)
	}

	// More leases at once than slots (a chunk of the pipeline holds all
	// its leases before committing): those past the arena are refused, in
	// order, with the reservation's reason.
	small := startDaemon(t, daemonOpts{arenaBytes: 50 * 1024, storeOpt: func(o *StoreOptions) { o.SlotBytes = 1024 }})
	sc := dial(t, small, ClientOptions{SharedArena: true})
	held, err := sc.Reserve(size) // and one lease held across the batch
	if err != nil || held.Token == 0 {
		t.Fatal(held, err)
	}
	if err := sc.BatchSetZeroCopy(ns, keys[:100], vals[:100], SetOptions{}, &sr); err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for i, ok := range sr.Accepted {
		if ok {
			accepted++
			if accepted != i+1 {
				t.Fatalf("item %d accepted after a refusal", i)
			}
		} else if sr.Reasons[i] != ReasonArenaFull {
			t.Fatalf("item %d: reason %q", i, sr.Reasons[i])
		}
	}
	if accepted != 49 {
		t.Fatalf("%d of 100 accepted, want 49", accepted)
	}
	if err := sc.Cancel(held.Token); err != nil {
		t.Fatal(err)
	}
	if err := sc.BatchGetInto(ns, keys[:accepted], &r); err != nil || !allTrue(r.Found) || !bytes.Equal(r.Values[48], vals[48]) {
		t.Fatal("accepted items not readable", err)
	}
	if st := small.store.Counters(); st.LeasesActive != 0 {
		t.Fatalf("%d leases left", st.LeasesActive)
	}
	if err := c.BatchSetZeroCopy(ns, keys[:2], vals[:1], SetOptions{}, &sr); !errors.Is(err, ErrConfig) {
		t.Fatal("arity mismatch accepted:", err)
	}
	inline := dial(t, d, ClientOptions{})
	if err := inline.BatchSetZeroCopy(ns, keys, vals, SetOptions{}, &sr); !errors.Is(err, ErrNoArena) {
		t.Fatal("zero-copy set without the arena:", err)
	}
	if err := inline.BatchGetInto(ns, keys[:3], &r); err != nil || !allTrue(r.Found) || !bytes.Equal(r.Values[2], vals[2]) {
		t.Fatal("inline batch get", err)
	}
}

// TestPipelinedRequestsAnsweredInOrder: requests written back to back in
// one write are all answered, in order (the daemon coalesces the answers);
// a bad frame after them still gets the earlier ones answered before the
// connection closes.
func TestPipelinedRequestsAnsweredInOrder(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	setter := dial(t, d, ClientOptions{})
	setter.Set(ns, key(1), value(1, 100), SetOptions{})
	raw := rawConn(t, d)
	en := NewEncoder()
	var pipe []byte
	want := []Op{}
	hit := map[int]bool{}
	for i := range 200 {
		switch i % 4 {
		case 0:
			en.Begin(OpStats, 0)
			want = append(want, OpStatsResponse)
		case 1:
			en.Begin(OpGet, 3)
			en.Bin("key", key(i%8))
			en.Str("model", ns.Model)
			en.Str("compat_key", ns.CompatKey)
			hit[len(want)] = i%8 == 1
			want = append(want, OpGetResponse)
		case 2:
			en.Begin(OpPrefetchHint, 4) // no answer
			en.Array("keys", 1)
			en.ElemBin(key(1))
			en.Str("model", ns.Model)
			en.Str("compat_key", ns.CompatKey)
			en.Int("deadline_ms", 10)
		case 3:
			en.Begin(OpExists, 3)
			en.Array("keys", 1)
			en.ElemBin(key(1))
			en.Str("model", ns.Model)
			en.Str("compat_key", ns.CompatKey)
			want = append(want, OpExistsResponse)
		}
		pipe = append(pipe, en.Frame()...)
	}
	pipe = append(pipe, 0, 0, 0, 1, 0xc1) // undecodable
	if _, err := raw.Write(pipe); err != nil {
		t.Fatal(err)
	}
	for i, op := range want {
		m, err := readMsg(t, raw)
		if err != nil || m.Op != op {
			t.Fatalf("answer %d: %v, want %v (%v)", i, m, op, err)
		}
		if op == OpGetResponse && (m.HasValue != hit[i] || hit[i] && !bytes.Equal(m.Value, value(1, 100))) {
			t.Fatalf("answer %d: wrong value", i)
		}
	}
	if _, err := readMsg(t, raw); !errors.Is(err, io.EOF) {
		t.Fatal("connection not closed after the bad frame:", err)
	}
}

// TestClientDeadlines: a request the daemon does not answer in time fails
// with the deadline or the cancellation, the client gives the connection
// up, and a context deadline of one request does not leak into the next.
func TestClientDeadlines(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	keys := [][]byte{key(1)}
	stall := func() func() { // the daemon's next store call blocks
		d.store.mu.Lock()
		return d.store.mu.Unlock
	}

	c := dial(t, d, ClientOptions{Timeout: 100 * time.Millisecond})
	release := stall()
	_, err := c.Exists(ns, keys, nil)
	release()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("stalled request with a timeout: %v", err)
	}
	if _, err := c.Stats(); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("call after a timed-out request: %v", err)
	}

	c = dial(t, d, ClientOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	release = stall()
	_, err = c.ExistsCtx(ctx, ns, keys, nil)
	release()
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("stalled request with a context deadline: %v", err)
	}

	c = dial(t, d, ClientOptions{})
	ctx, cancel = context.WithCancel(context.Background())
	release = stall()
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = c.StatsCtx(ctx)
	release()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v", err)
	}
	if _, err := c.ExistsCtx(context.Background(), ns, keys, nil); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("call after a cancelled request: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := dial(t, d, ClientOptions{}).StatsCtx(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("request with a cancelled context: %v", err)
	}

	// A finished request's deadline and cancellation do not reach the next.
	c = dial(t, d, ClientOptions{})
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	if _, err := c.ExistsCtx(ctx, ns, keys, nil); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	cancel()
	time.Sleep(50 * time.Millisecond)
	if _, err := c.Exists(ns, keys, nil); err != nil {
		t.Fatal("a past request's deadline broke the next:", err)
	}
	if ok, _, err := c.Set(ns, key(2), value(2, 100), SetOptions{}); !ok || err != nil {
		t.Fatal(err)
	}
	// Server errors leave the connection usable.
	if _, _, err := c.BatchSet(ns, keys, nil, SetOptions{}); !errors.Is(err, ErrServer) {
		t.Fatal("arity mismatch:", err)
	}
	if _, err := c.Stats(); err != nil {
		t.Fatal("an error frame broke the connection:", err)
	}
}

// TestBatchGetIntoDoesNotAllocate: a batch get through the client over the
// arena, values copied into the caller's buffers, allocates nothing in the
// client or the daemon once warmed.
func TestBatchGetIntoDoesNotAllocate(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	c := dial(t, d, ClientOptions{SharedArena: true})
	keys := [][]byte{key(1), key(2), key(3), key(4)}
	for i, k := range keys[:3] {
		c.Set(ns, k, value(i, 2000), SetOptions{})
	}
	var r BatchResult
	get := func() {
		if err := c.BatchGetInto(ns, keys, &r); err != nil || !r.Found[2] || r.Found[3] {
			t.Fatal("batch get", err)
		}
	}
	get()
	if n := testing.AllocsPerRun(100, get); n != 0 {
		t.Fatalf("batch get into allocates %v", n)
	}
}
