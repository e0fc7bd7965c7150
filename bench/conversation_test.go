package bench

import (
	"math"
	"reflect"
	"slices"
	"testing"
)

func TestConversationWorkloadShape(t *testing.T) {
	const n = 4000
	mk := func(seed int64) *conversationWorkload {
		return newConversationWorkload(seed, n, 3, 70, 215, 8, 300, 2, 0.05)
	}
	w := mk(11)
	items := collect(t, w, n)
	again := collect(t, mk(11), n)
	if !slices.Equal(prompts(items), prompts(again)) {
		t.Fatal("same seed gave different conversations")
	}
	if slices.Equal(prompts(items)[:50], prompts(collect(t, mk(12), 50))) {
		t.Fatal("another seed gave the same conversations")
	}
	if _, ok := w.next(n); ok {
		t.Fatal("the workload did not end after its requests")
	}
	// Sent in time order; turns of a session wait for the one before and
	// extend it.
	last := map[int]int{} // session → index of its latest turn
	turns := map[int]int{}
	systems := map[string]int{}
	for i, it := range items {
		c := w.sched[i]
		if i > 0 && it.at < items[i-1].at {
			t.Fatalf("request %d scheduled before request %d", i, i-1)
		}
		if got, want := len(it.messages), 2*c.turn+2; got != want {
			t.Fatalf("request %d (turn %d): %d messages, want %d", i, c.turn, got, want)
		}
		if it.messages[0].role != "system" {
			t.Fatalf("request %d opens with %q", i, it.messages[0].role)
		}
		if c.turn == 0 {
			systems[it.messages[0].content]++
			if it.after != nil {
				t.Fatalf("request %d opens a session but waits", i)
			}
		} else {
			j, ok := last[c.session]
			if !ok || w.sched[j].turn != c.turn-1 {
				t.Fatalf("request %d: turn %d of session %d without the turn before", i, c.turn, c.session)
			}
			prev := items[j]
			if !reflect.DeepEqual(it.messages[:len(prev.messages)], prev.messages) {
				t.Fatalf("request %d does not extend its session's previous turn", i)
			}
			if it.after != (<-chan struct{})(prev.done) {
				t.Fatalf("request %d does not wait for its previous turn", i)
			}
		}
		last[c.session] = i
		turns[c.session] = max(turns[c.session], c.turn+1)
	}
	// Turns per session: mean near 3 (sessions cut by the end of the
	// schedule aside), some long ones.
	sum, long := 0, 0
	for _, k := range turns {
		sum += k
		if k >= 8 {
			long++
		}
	}
	if mean := float64(sum) / float64(len(turns)); mean < 2.3 || mean > 3.5 || long == 0 {
		t.Fatalf("turns per session: mean %.2f, %d sessions of 8 or more", mean, long)
	}
	// Prefix reuse: a few system prompts, the most popular one most used.
	if len(systems) < 4 || len(systems) > 8 {
		t.Fatalf("%d distinct system prompts, want 4..8", len(systems))
	}
	top := w.prefixes[0]
	for s, k := range systems {
		if k > systems[top] {
			t.Fatalf("system prompt %.20q used %d times, more than the most popular's %d", s, k, systems[top])
		}
	}
	// Burstiness: session starts' gaps have a CV well above Poisson's 1.
	var gaps []float64
	prev := -1.0
	for i, c := range w.sched {
		if c.turn == 0 {
			at := items[i].at.Seconds()
			if prev >= 0 {
				gaps = append(gaps, at-prev)
			}
			prev = at
		}
	}
	mean, sq := 0.0, 0.0
	for _, g := range gaps {
		mean += g
	}
	mean /= float64(len(gaps))
	for _, g := range gaps {
		sq += (g - mean) * (g - mean)
	}
	if cv := math.Sqrt(sq/float64(len(gaps))) / mean; cv < 1.4 {
		t.Fatalf("session inter-arrival CV %.2f, want bursty (about 2)", cv)
	}
	if mean < 0.3 || mean > 0.7 {
		t.Fatalf("mean session gap %.3f s at 2 sessions/s", mean)
	}
}

func TestConversationWorkloadOptions(t *testing.T) {
	o := baseOptions("http://127.0.0.1:1")
	o.Workload = WorkloadConversation
	o.Requests, o.Turns, o.PrefixGroups, o.PrefixLen = 10, 3, 4, 50
	if err := o.Validate(); err != nil {
		t.Fatalf("conversation options: %v", err)
	}
	o.Turns = 0
	if err := o.Validate(); err == nil {
		t.Fatal("turns 0 accepted")
	}
}
