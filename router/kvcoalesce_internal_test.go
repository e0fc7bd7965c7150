package router

import (
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/openai"
)

// coalesceEnv is a two-worker precise fleet priced by TTFT that holds
// followers for at most wait.
func coalesceEnv(t *testing.T, wait time.Duration) *kvEnv {
	e := newKVEnv(t, kvConfig(func(c *KVAwareConfig) {
		c.TokenizerSpec, c.ProvisionalTTL, c.Cost, c.CoalesceWait = TokenizerBytes, 0, KVCostTTFT, wait
	}), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	return e
}

// pickAsync picks body on another goroutine; the ticket arrives on the
// channel returned.
func (e *kvEnv) pickAsync(body string) <-chan Ticket {
	var req openai.Request
	if err := openai.Scan([]byte(body), &req); err != nil {
		e.t.Fatalf("scan %s: %v", body, err)
	}
	out := make(chan Ticket, 1)
	go func() {
		tk, _ := e.p.Pick(&PickInput{Route: RouteChatCompletions, Body: []byte(body), Request: &req, RequestID: []byte("follower")}, e.cands())
		out <- tk
	}()
	return out
}

// setPred sets the estimated TTFT of a ticket in flight, as if priced so.
func setPred(tk Ticket, pred float64) {
	kt := tk.State.(*kvTicket)
	kt.target.mu.Lock()
	kt.pred = pred
	kt.target.mu.Unlock()
}

// held reports whether the pick on ch is still held a while after it
// began, or returns its ticket: a pick that does not hold returns within
// microseconds, so 100 ms tells a hold from none without timing anything
// that passes.
func held(ch <-chan Ticket) (Ticket, bool) {
	select {
	case tk := <-ch:
		return tk, false
	case <-time.After(100 * time.Millisecond):
		return Ticket{}, true
	}
}

// coalesced is the count of holds that ended by outcome, as scraped.
func (e *kvEnv) coalesced(outcome string) float64 {
	return gatherLabeled(e.t, e.r, "infera_router_kv_coalesce_holds_total", outcome)
}

// TestKVCoalesceHoldsUntilFirstToken: a request whose prompt prefix a
// request in flight on its worker is still prefilling is held until that
// request's first token, then sent to the same worker; without the hold it
// would be sent at once and prefill the prefix's tail again beside it.
func TestKVCoalesceHoldsUntilFirstToken(t *testing.T) {
	e := coalesceEnv(t, time.Minute)
	prefix := unique(61, 3000)
	leader := e.pick(chat(prefix))
	setPred(leader, 60) // its estimate does not end the hold
	ch := e.pickAsync(chat(prefix + unique(62, 64)))
	if _, ok := held(ch); !ok {
		t.Fatal("the follower was sent while the leader was prefilling its prefix")
	}
	leader.Worker.stall.noteServed(time.Now().UnixNano(), leader.State)
	var follower Ticket
	select {
	case follower = <-ch:
	case <-time.After(testkit.EventuallyTimeout):
		t.Fatal("the follower was still held after the leader's first token")
	}
	if follower.Worker != leader.Worker {
		t.Errorf("the follower went to %s, not to the leader's %s", follower.Worker.id, leader.Worker.id)
	}
	if got := e.coalesced("first_token"); got != 1 {
		t.Errorf("holds ended by a first token: %v, want 1", got)
	}
	e.p.Release(follower, Result{Status: 200})
	e.p.Release(leader, Result{Status: 200})
}

// TestKVCoalesceReleasedByLeaderEnd: a leader that ends (an error, or a
// unary answer) before any first token was seen releases its followers.
func TestKVCoalesceReleasedByLeaderEnd(t *testing.T) {
	e := coalesceEnv(t, time.Minute)
	prefix := unique(63, 3000)
	leader := e.pick(chat(prefix))
	setPred(leader, 60)
	ch := e.pickAsync(chat(prefix + unique(64, 64)))
	if _, ok := held(ch); !ok {
		t.Fatal("the follower was sent while the leader was prefilling its prefix")
	}
	e.p.Release(leader, Result{Status: 502})
	select {
	case follower := <-ch:
		e.p.Release(follower, Result{Status: 200})
	case <-time.After(testkit.EventuallyTimeout):
		t.Fatal("the follower was still held after the leader ended")
	}
}

// TestKVCoalesceEndsAtEstimateAndLimit: a leader whose first token the
// router never sees holds its follower until its estimated first token
// (plus slack), and never longer than CoalesceWait.
func TestKVCoalesceEndsAtEstimateAndLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pred    float64
		wait    time.Duration
		outcome string
	}{
		{"estimate", 0.05, time.Minute, "estimate"},
		{"limit", 60, 50 * time.Millisecond, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := coalesceEnv(t, tc.wait)
			prefix := unique(65, 3000)
			leader := e.pick(chat(prefix))
			setPred(leader, tc.pred)
			select {
			case follower := <-e.pickAsync(chat(prefix + unique(66, 64))):
				e.p.Release(follower, Result{Status: 200})
			case <-time.After(testkit.EventuallyTimeout):
				t.Fatal("the follower was held past the leader's estimate and the limit")
			}
			if got := e.coalesced(tc.outcome); got != 1 {
				t.Errorf("holds ended by %s: %v, want 1", tc.outcome, got)
			}
			e.p.Release(leader, Result{Status: 200})
		})
	}
}

// TestKVCoalesceNoHold: no hold when the leader is past its first token
// (its prompt is cached), when the engine has reported the shared prefix
// cached, or with CoalesceWait 0.
func TestKVCoalesceNoHold(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait time.Duration
		set  func(e *kvEnv, leader Ticket, prefix string)
	}{
		{"past its first token", time.Minute, func(e *kvEnv, leader Ticket, _ string) {
			leader.Worker.stall.noteServed(time.Now().UnixNano(), leader.State)
		}},
		{"prefix reported cached", time.Minute, func(e *kvEnv, leader Ticket, prefix string) {
			e.store(leader.Worker.id, chatTokens(t, prefix))
		}},
		{"off", 0, func(*kvEnv, Ticket, string) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := coalesceEnv(t, tc.wait)
			prefix := unique(67, 3000)
			leader := e.pick(chat(prefix))
			setPred(leader, 60)
			tc.set(e, leader, prefix)
			follower, ok := held(e.pickAsync(chat(prefix + unique(68, 64))))
			if ok {
				t.Fatal("the follower was held")
			}
			e.p.Release(follower, Result{Status: 200})
			e.p.Release(leader, Result{Status: 200})
		})
	}
}

// TestKVCoalesceStreamLeaderLate: a stream leader late on its estimate
// (waiting for room in its engine, mostly) still holds its follower until
// its first token, which the router sees.
func TestKVCoalesceStreamLeaderLate(t *testing.T) {
	e := coalesceEnv(t, time.Minute)
	prefix := unique(69, 3000)
	leader := e.pick(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + prefix + `"}]}`)
	setPred(leader, 0.001) // its estimated first token has passed
	ch := e.pickAsync(chat(prefix + unique(70, 64)))
	if _, ok := held(ch); !ok {
		t.Fatal("the follower was sent at the estimate of a stream leader still prefilling its prefix")
	}
	leader.Worker.stall.noteServed(time.Now().UnixNano(), leader.State)
	select {
	case follower := <-ch:
		e.p.Release(follower, Result{Status: 200})
	case <-time.After(testkit.EventuallyTimeout):
		t.Fatal("the follower was still held after the leader's first token")
	}
	if got := e.coalesced("first_token"); got != 1 {
		t.Errorf("holds ended by a first token: %v, want 1", got)
	}
	e.p.Release(leader, Result{Status: 200})
}
